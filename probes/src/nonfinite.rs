//! Floats that may be NaN or ±inf, through JSON and back.
//!
//! JSON has no NaN or infinity: serde_json writes them as `null`, and reading `null` into a
//! float fails — a diverging loss would break the stream that carries it. A finite value is
//! written as a plain number; NaN, `inf` and `-inf` as those strings. Both ends of every wire
//! and file use these functions, so they agree; `null` (what an older writer sent) reads back
//! as NaN. Use with `#[serde(with = "probes::nonfinite")]` on an `f32`/`f64` field, and the
//! [`option`] and [`vec`] modules for `Option<_>` and `Vec<_>` fields.

use serde::de::{self, Deserializer, Visitor};

/// The JSON Schema of a float written here: a number, or "NaN", "inf", "-inf" (and `null`,
/// which an older writer sent for them). `#[schemars(with = "probes::nonfinite::Json")]` on a
/// field that has `#[serde(with = "probes::nonfinite")]`; `Option<Json>`, `Vec<Json>` for the
/// others.
pub struct Json;

impl schemars::JsonSchema for Json {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Float".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A number; NaN and ±infinity as the strings \"NaN\", \"inf\", \"-inf\" (null: NaN).",
            "anyOf": [{ "type": "number" }, { "enum": ["NaN", "inf", "-inf"] }, { "type": "null" }]
        })
    }
}
use serde::ser::Serializer;
use std::fmt;

/// An `f32` or `f64`: what the functions here need of it.
pub trait Float: Copy {
    /// As `f64`, for writing.
    fn to_f64(self) -> f64;
    /// From `f64`, for reading (`as` semantics: out-of-range values become ±inf).
    fn from_f64(x: f64) -> Self;
}

impl Float for f32 {
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}

impl Float for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(x: f64) -> Self {
        x
    }
}

/// The word a non-finite value is written as; `None` for a finite one.
pub fn word(x: f64) -> Option<&'static str> {
    if x.is_nan() {
        Some("NaN")
    } else if x == f64::INFINITY {
        Some("inf")
    } else if x == f64::NEG_INFINITY {
        Some("-inf")
    } else {
        None
    }
}

/// The value a word stands for: `NaN`, `inf`, `-inf` (and the spellings Python and
/// JavaScript print: `nan`, `Infinity`, `-Infinity`, `+inf`).
fn from_word(s: &str) -> Option<f64> {
    match s.trim() {
        "NaN" | "nan" | "NAN" => Some(f64::NAN),
        "inf" | "+inf" | "Infinity" | "+Infinity" | "INF" => Some(f64::INFINITY),
        "-inf" | "-Infinity" | "-INF" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// Writes `x`: a number when finite, else its word.
pub fn serialize<T: Float, S: Serializer>(x: &T, s: S) -> Result<S::Ok, S::Error> {
    let v = x.to_f64();
    match word(v) {
        Some(w) => s.serialize_str(w),
        None => s.serialize_f64(v),
    }
}

/// Reads a number, a word, or `null` (NaN).
pub fn deserialize<'de, T: Float, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
    d.deserialize_any(FloatVisitor).map(T::from_f64)
}

struct FloatVisitor;

impl<'de> Visitor<'de> for FloatVisitor {
    type Value = f64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number, \"NaN\", \"inf\" or \"-inf\"")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        from_word(v).ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
    }
    fn visit_unit<E: de::Error>(self) -> Result<f64, E> {
        Ok(f64::NAN)
    }
    fn visit_none<E: de::Error>(self) -> Result<f64, E> {
        Ok(f64::NAN)
    }
}

/// For `Option<f32>` / `Option<f64>` fields: `None` is `null`; `Some(NaN)` is `"NaN"`.
pub mod option {
    use super::{Float, FloatVisitor};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `None` as `null`, a value as [`super::serialize`] does.
    pub fn serialize<T: Float, S: Serializer>(x: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match x {
            Some(v) => super::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    /// Reads `null` as `None`, else a number or a word.
    pub fn deserialize<'de, T: Float, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
        #[derive(Deserialize)]
        struct Wrap(#[serde(deserialize_with = "any")] f64);
        fn any<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
            d.deserialize_any(FloatVisitor)
        }
        Ok(Option::<Wrap>::deserialize(d)?.map(|w| T::from_f64(w.0)))
    }
}

/// For `Vec<f32>` / `Vec<f64>` fields.
pub mod vec {
    use super::{Float, FloatVisitor};
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes each value as [`super::serialize`] does.
    pub fn serialize<T: Float, S: Serializer>(xs: &[T], s: S) -> Result<S::Ok, S::Error> {
        struct One<T>(T);
        impl<T: Float> serde::Serialize for One<T> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                super::serialize(&self.0, s)
            }
        }
        let mut seq = s.serialize_seq(Some(xs.len()))?;
        for x in xs {
            seq.serialize_element(&One(*x))?;
        }
        seq.end()
    }

    /// Reads a list of numbers, words or `null`s.
    pub fn deserialize<'de, T: Float, D: Deserializer<'de>>(d: D) -> Result<Vec<T>, D::Error> {
        #[derive(Deserialize)]
        struct Wrap(#[serde(deserialize_with = "any")] f64);
        fn any<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
            d.deserialize_any(FloatVisitor)
        }
        Ok(Vec::<Wrap>::deserialize(d)?.into_iter().map(|w| T::from_f64(w.0)).collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize)]
    struct R {
        #[serde(with = "super")]
        a: f32,
        #[serde(with = "super")]
        b: f64,
        #[serde(with = "super::option", default)]
        c: Option<f32>,
        #[serde(with = "super::vec", default)]
        d: Vec<f32>,
    }

    fn same(x: f64, y: f64) -> bool {
        (x.is_nan() && y.is_nan()) || x == y
    }

    #[test]
    fn every_float_survives_json_and_back() {
        let table = [0.0, 1.5, -2.25, 1e30, f64::NAN, f64::INFINITY, f64::NEG_INFINITY];
        for x in table {
            let r = R { a: x as f32, b: x, c: Some(x as f32), d: vec![x as f32, 1.0] };
            let text = serde_json::to_string(&r).unwrap();
            let back: R = serde_json::from_str(&text).unwrap();
            assert!(same(f64::from(back.a), f64::from(x as f32)), "{x}: {text}");
            assert!(same(back.b, x), "{x}: {text}");
            assert!(same(f64::from(back.c.unwrap()), f64::from(x as f32)), "{x}: {text}");
            assert!(same(f64::from(back.d[0]), f64::from(x as f32)) && back.d[1] == 1.0, "{x}: {text}");
        }
    }

    #[test]
    fn finite_values_stay_plain_numbers_and_null_reads_as_nan_or_none() {
        let r = R { a: 2.0, b: f64::INFINITY, c: None, d: vec![f32::NAN] };
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"a":2.0,"b":"inf","c":null,"d":["NaN"]}"#);
        let old: R = serde_json::from_str(r#"{"a":null,"b":3,"c":null,"d":[null,"Infinity"]}"#).unwrap();
        assert!(old.a.is_nan() && old.b == 3.0 && old.c.is_none());
        assert!(old.d[0].is_nan() && old.d[1] == f32::INFINITY);
        let e = serde_json::from_str::<R>(r#"{"a":"lots","b":1}"#).unwrap_err().to_string();
        assert!(e.contains("lots") && e.contains("NaN"), "{e}");
    }

    #[test]
    fn a_value_too_big_for_f32_becomes_inf_not_an_error() {
        let r: R = serde_json::from_str(r#"{"a":1e39,"b":1e39}"#).unwrap();
        assert_eq!(r.a, f32::INFINITY);
        assert_eq!(r.b, 1e39);
    }
}

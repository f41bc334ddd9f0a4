//! Who trains and where, typed: the [`Framework`] of the training loop and the [`Device`] it
//! trains on. Each is written as the string it always was in the summary (`"pytorch"`,
//! `"cuda:0"`), so old summaries read as before; the code asks the type, never the string.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The training loop's framework: pipeprof's own, or a program's as its hooks named it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum Framework {
    /// pipeprof's own loop (`pipeprof profile`): written `""`.
    #[default]
    Own,
    /// A PyTorch program (`"pytorch"`; `"torch"` read too).
    PyTorch,
    /// A Keras or tf.keras program (`"keras"`; `"tensorflow"`, `"tf.keras"` read too).
    Keras,
    /// A program whose framework advice has no words for, by the name it gave.
    Other(String),
}

impl Framework {
    /// pipeprof's own loop.
    pub fn is_own(&self) -> bool {
        *self == Framework::Own
    }

    /// A framework whose loader advice can name (PyTorch's `DataLoader`, Keras's loaders).
    pub fn has_knobs(&self) -> bool {
        matches!(self, Framework::PyTorch | Framework::Keras)
    }

    /// Written as: `""`, `"pytorch"`, `"keras"`, or the name given.
    pub fn name(&self) -> &str {
        match self {
            Framework::Own => "",
            Framework::PyTorch => "pytorch",
            Framework::Keras => "keras",
            Framework::Other(n) => n,
        }
    }
}

impl From<String> for Framework {
    fn from(name: String) -> Framework {
        match name.as_str() {
            "" => Framework::Own,
            "pytorch" | "torch" => Framework::PyTorch,
            "keras" | "tensorflow" | "tf.keras" => Framework::Keras,
            _ => Framework::Other(name),
        }
    }
}

impl From<&str> for Framework {
    fn from(name: &str) -> Framework {
        Framework::from(name.to_string())
    }
}

impl From<Framework> for String {
    fn from(f: Framework) -> String {
        f.name().to_string()
    }
}

impl fmt::Display for Framework {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The device the run trains on, as the run named it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum Device {
    /// Not said (a program that never moved a batch where pipeprof sees it): written `""`.
    #[default]
    Unseen,
    /// The CPU (`"cpu"`, `"CPU:0"`: any name starting with "cpu", any case).
    Cpu(String),
    /// Anything else (`"cuda:0"`, `"mps"`), by its name.
    Accelerator(String),
}

impl Device {
    /// The device's name as the run gave it; `""` when unseen.
    pub fn name(&self) -> &str {
        match self {
            Device::Unseen => "",
            Device::Cpu(n) | Device::Accelerator(n) => n,
        }
    }

    /// The run said nothing of its device.
    pub fn is_unseen(&self) -> bool {
        *self == Device::Unseen
    }

    /// The run named the CPU.
    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu(_))
    }
}

impl From<String> for Device {
    fn from(name: String) -> Device {
        let t = name.trim();
        if t.is_empty() {
            Device::Unseen
        } else if t.to_ascii_lowercase().starts_with("cpu") {
            Device::Cpu(name)
        } else {
            Device::Accelerator(name)
        }
    }
}

impl From<&str> for Device {
    fn from(name: &str) -> Device {
        Device::from(name.to_string())
    }
}

impl From<Device> for String {
    fn from(d: Device) -> String {
        d.name().to_string()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framework_and_a_device_read_from_their_names_and_write_them_back() {
        // (written, read as, written back)
        let frameworks = [
            ("", Framework::Own, ""),
            ("pytorch", Framework::PyTorch, "pytorch"),
            ("torch", Framework::PyTorch, "pytorch"),
            ("keras", Framework::Keras, "keras"),
            ("tensorflow", Framework::Keras, "keras"),
            ("tf.keras", Framework::Keras, "keras"),
            ("jax", Framework::Other("jax".into()), "jax"),
        ];
        for (name, want, back) in frameworks {
            let f: Framework = serde_json::from_value(serde_json::json!(name)).unwrap_or_default();
            assert_eq!(f, want, "{name}");
            assert_eq!(serde_json::to_value(&f).ok(), Some(serde_json::json!(back)), "{name}");
        }
        let devices = [
            ("", Device::Unseen, true, false),
            ("  ", Device::Unseen, true, false),
            ("cpu", Device::Cpu("cpu".into()), false, true),
            ("CPU:0", Device::Cpu("CPU:0".into()), false, true),
            ("cuda:0", Device::Accelerator("cuda:0".into()), false, false),
            ("mps", Device::Accelerator("mps".into()), false, false),
        ];
        for (name, want, unseen, cpu) in devices {
            let d: Device = serde_json::from_value(serde_json::json!(name)).unwrap_or_default();
            assert_eq!((d.is_unseen(), d.is_cpu()), (unseen, cpu), "{name}");
            assert_eq!(serde_json::to_value(&d).ok(), Some(serde_json::json!(want.name())), "{name}");
            assert_eq!(d, want, "{name}");
        }
    }
}

//! The attach wire format. Every byte from the other side is hostile: lengths are checked
//! before anything is allocated, and every malformed input is an error, never a panic.
//!
//! Handshake: the client sends [`MAGIC`], its version (u16 LE) and the run's token (u8
//! length, then that many bytes; empty on a Unix socket, where the file's permissions decide
//! who connects); the server answers with a [`Frame::Hello`]. On TCP a wrong or missing token
//! is refused before anything about the run is sent. Then frames flow server → client: `[u32 LE length][u8 tag][payload]`,
//! length counting the tag. Span batches are binary (53 bytes per span); the rare events
//! (threads, steps, samples, skipped files) are JSON.
//!
//! [`VERSION`] changes when a frame stops reading as before; a field added to a JSON frame is
//! optional (`serde(default)`, left out when it says nothing), so peers of the same version
//! read each other's frames with or without it (a thread's [`ThreadRole`] travels that way).
//!
//! A producer (a worker process of the profiled program) opens with [`PRODUCER_MAGIC`]
//! instead, sends its own [`Frame::Hello`], then the same frames client → server; the server
//! relays them into its run (see [`super::producer`]).

use crate::event::{Event, SpanRecord};
use crate::role::ThreadRole;
use crate::sample::{GpuSample, HostSample};
use crate::stage::Stage;
use crate::StepRecord;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// Starts every connection.
pub const MAGIC: &[u8; 4] = b"PPRF";
/// Starts a producer's connection: a process sending its spans into another's run.
pub const PRODUCER_MAGIC: &[u8; 4] = b"PPRP";
/// Protocol version; both sides must agree.
pub const VERSION: u16 = 4;
/// Longest token accepted in a handshake.
pub const MAX_TOKEN: usize = 64;
/// Environment variable holding the run's token: set by a TCP server for its worker
/// processes, and read by viewers and producers.
pub const TOKEN_ENV: &str = "PIPEPROF_TOKEN";
/// Largest frame accepted: a decoder never allocates more than this for one frame.
pub const MAX_FRAME: usize = 1 << 20;
/// Bytes per span in a span batch.
pub const SPAN_BYTES: usize = 61;

const TAG_HELLO: u8 = 1;
const TAG_SPANS: u8 = 2;
const TAG_EVENT: u8 = 3;
const TAG_END: u8 = 4;

/// Why a frame or handshake was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The other side did not speak this protocol.
    #[error("not a pipeprof peer (bad magic bytes)")]
    BadMagic,
    /// Protocol versions differ.
    #[error("protocol version {theirs}, this side speaks {VERSION}")]
    Version {
        /// The peer's version.
        theirs: u16,
    },
    /// A frame longer than [`MAX_FRAME`] (or empty).
    #[error("frame length {0} outside 1..={MAX_FRAME}")]
    Length(usize),
    /// The stream ended inside a frame.
    #[error("truncated frame")]
    Truncated,
    /// An unknown frame tag.
    #[error("unknown frame tag {0}")]
    Tag(u8),
    /// A payload that does not decode.
    #[error("malformed {what}: {why}")]
    Malformed {
        /// Which frame kind.
        what: &'static str,
        /// What was wrong.
        why: String,
    },
    /// A TCP peer without the run's token.
    #[error("missing or wrong token: this run listens on TCP and admits only peers with its token (set {TOKEN_ENV} to the token the run printed)")]
    Token,
    /// The connection closed cleanly between frames.
    #[error("connection closed")]
    Closed,
    /// Another I/O error.
    #[error("i/o: {0}")]
    Io(String),
}

/// What a server says about itself when a client connects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// Protocol version.
    pub version: u16,
    /// The profiled process.
    pub pid: u32,
    /// Its name, as it chose to give it.
    pub program: String,
    /// Its run settings (free-form JSON; pipeprof reads its own `RunSettings` keys).
    pub settings: serde_json::Value,
    /// Threads that have sent spans so far: (probes thread id, name).
    pub threads: Vec<(u32, String)>,
    /// The roles of those of `threads` that have one (not [`ThreadRole::Other`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<(u32, ThreadRole)>,
    /// The process's rank in a distributed run (from `RANK`/`WORLD_SIZE`/`LOCAL_RANK`), if any:
    /// a relay counts a ranked producer's events for its rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<crate::Rank>,
    /// A producer connecting again: events it lost so far and has not told (its channel was
    /// full, or a broken connection took them). The run counts them as dropped.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Hello {
    /// This process's greeting: its pid, the program name and settings it gives, its rank from
    /// the launcher's environment, and no threads yet.
    pub fn this_process(program: String, settings: serde_json::Value) -> Hello {
        Hello {
            version: VERSION,
            pid: std::process::id(),
            program,
            settings,
            threads: Vec::new(),
            roles: Vec::new(),
            rank: crate::Rank::from_env(),
            dropped: 0,
        }
    }

    /// Its threads as the events that announce them, each with its role.
    pub fn thread_events(&self) -> Vec<Event> {
        let role = |id: u32| self.roles.iter().find(|(i, _)| *i == id).map(|(_, r)| *r).unwrap_or_default();
        self.threads
            .iter()
            .map(|(id, name)| Event::Thread { id: *id, name: name.clone().into_boxed_str(), role: role(*id) })
            .collect()
    }
}

/// The server's counters, sent with [`Frame::End`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerStats {
    /// Events the probe dropped because its channel was full.
    pub events_dropped: u64,
    /// Clients disconnected for reading too slowly.
    pub slow_clients_dropped: u64,
    /// Connections refused for a bad handshake.
    pub bad_handshakes: u64,
    /// Frames not sent because they could not be encoded (JSON failed, or longer than
    /// [`MAX_FRAME`]).
    #[serde(default)]
    pub unencodable_frames: u64,
    /// Connections refused because [`super::server::MAX_CONNECTIONS`] were being served.
    #[serde(default)]
    pub connections_refused: u64,
}

/// The events other than span batches, as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WireEvent {
    /// A thread's name and role.
    Thread {
        /// Probes thread id.
        id: u32,
        /// Name.
        name: String,
        /// Role; left out for [`ThreadRole::Other`] (and read as it when absent).
        #[serde(default, skip_serializing_if = "ThreadRole::is_other")]
        role: ThreadRole,
    },
    /// A training step.
    Step(StepRecord),
    /// A skipped file.
    Skipped {
        /// Path.
        path: String,
        /// Why.
        reason: String,
    },
    /// A host sample.
    Host(HostSample),
    /// A GPU sample.
    Gpu(GpuSample),
    /// Settings learned while the run goes (see [`Event::Settings`]).
    Settings(serde_json::Value),
    /// The program failed, and why (see [`Event::Failed`]).
    Failed(String),
}

/// One server → client message.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// First frame on every connection.
    Hello(Hello),
    /// Closed spans.
    Spans(Vec<SpanRecord>),
    /// Another event.
    Event(WireEvent),
    /// The run ended.
    End(ServerStats),
}

impl Frame {
    /// The frame carrying `ev`, if it travels (control events do not).
    pub fn from_event(ev: &Event) -> Option<Frame> {
        Some(match ev {
            Event::Span(s) => Frame::Spans(vec![*s]),
            Event::Spans(v) => Frame::Spans(v.clone()),
            Event::Thread { id, name, role } => {
                Frame::Event(WireEvent::Thread { id: *id, name: name.to_string(), role: *role })
            }
            Event::Step(s) => Frame::Event(WireEvent::Step(*s)),
            Event::Skipped { path, reason } => {
                Frame::Event(WireEvent::Skipped { path: path.to_string(), reason: reason.to_string() })
            }
            Event::Host(h) => Frame::Event(WireEvent::Host((**h).clone())),
            Event::Gpu(g) => Frame::Event(WireEvent::Gpu((**g).clone())),
            Event::Settings(v) => Frame::Event(WireEvent::Settings((**v).clone())),
            Event::Failed(why) => Frame::Event(WireEvent::Failed(why.to_string())),
            // A viewer of this process sees a ranked producer's events as the run's (the rank
            // travels in each connection's hello, not per frame).
            Event::Ranked(_, inner) => return Frame::from_event(inner),
            // Layer times come from pipeprof's own model, never from an attached program.
            Event::Finish | Event::Workers { .. } | Event::Stalled { .. } | Event::Layer(_) => return None,
        })
    }

    /// The events this frame stands for, on the receiving side.
    pub fn into_event(self) -> Option<Event> {
        Some(match self {
            Frame::Spans(v) => Event::Spans(v),
            Frame::Event(WireEvent::Thread { id, name, role }) => {
                Event::Thread { id, name: name.into_boxed_str(), role }
            }
            Frame::Event(WireEvent::Step(s)) => Event::Step(s),
            Frame::Event(WireEvent::Skipped { path, reason }) => {
                Event::Skipped { path: path.into_boxed_str(), reason: reason.into_boxed_str() }
            }
            Frame::Event(WireEvent::Host(h)) => Event::Host(Box::new(h)),
            Frame::Event(WireEvent::Gpu(g)) => Event::Gpu(Box::new(g)),
            Frame::Event(WireEvent::Settings(v)) => Event::Settings(Box::new(v)),
            Frame::Event(WireEvent::Failed(why)) => Event::Failed(why.into_boxed_str()),
            Frame::Hello(_) | Frame::End(_) => return None,
        })
    }
}

fn json<T: Serialize>(tag: u8, v: &T) -> Result<Vec<u8>, WireError> {
    let body =
        serde_json::to_vec(v).map_err(|e| WireError::Malformed { what: "outgoing frame", why: e.to_string() })?;
    // The reader refuses longer frames (and drops the connection): never send one.
    let len = body.len() + 1;
    if len > MAX_FRAME {
        return Err(WireError::Length(len));
    }
    let mut out = Vec::with_capacity(4 + len);
    out.extend((len as u32).to_le_bytes());
    out.push(tag);
    out.extend(body);
    Ok(out)
}

/// Encodes a frame with its length prefix; `Err` for a frame that cannot be sent (its JSON
/// fails, or it is longer than [`MAX_FRAME`]): the sender counts it and goes on. Span batches
/// longer than fit are cut (the Layer sends 64 at a time; the cut never happens in practice).
pub fn encode(f: &Frame) -> Result<Vec<u8>, WireError> {
    match f {
        Frame::Hello(h) => json(TAG_HELLO, h),
        Frame::Event(e) => json(TAG_EVENT, e),
        Frame::End(s) => json(TAG_END, s),
        Frame::Spans(v) => {
            let n = v.len().min((MAX_FRAME - 3) / SPAN_BYTES).min(u16::MAX as usize);
            let len = 1 + 2 + n * SPAN_BYTES;
            let mut out = Vec::with_capacity(4 + len);
            out.extend((len as u32).to_le_bytes());
            out.push(TAG_SPANS);
            out.extend((n as u16).to_le_bytes());
            for s in &v[..n] {
                out.push(s.stage as u8);
                out.extend(s.thread.to_le_bytes());
                for x in [s.start_ns, s.dur_ns, s.cpu_ns, s.step, s.sample, s.bytes, s.queue_ns] {
                    out.extend(x.to_le_bytes());
                }
            }
            Ok(out)
        }
    }
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

/// Decodes one frame body (tag + payload, without the length prefix).
pub fn decode(body: &[u8]) -> Result<Frame, WireError> {
    let (&tag, payload) = body.split_first().ok_or(WireError::Length(0))?;
    let bad = |what: &'static str, why: String| WireError::Malformed { what, why };
    match tag {
        TAG_HELLO => serde_json::from_slice(payload).map(Frame::Hello).map_err(|e| bad("hello", e.to_string())),
        TAG_EVENT => serde_json::from_slice(payload).map(Frame::Event).map_err(|e| bad("event", e.to_string())),
        TAG_END => serde_json::from_slice(payload).map(Frame::End).map_err(|e| bad("end", e.to_string())),
        TAG_SPANS => {
            if payload.len() < 2 {
                return Err(bad("spans", "no count".into()));
            }
            let n = u16::from_le_bytes([payload[0], payload[1]]) as usize;
            let rest = &payload[2..];
            if rest.len() != n * SPAN_BYTES {
                return Err(bad("spans", format!("{} bytes for {n} spans", rest.len())));
            }
            let mut v = Vec::with_capacity(n);
            for c in rest.chunks_exact(SPAN_BYTES) {
                let stage = *Stage::ALL.get(c[0] as usize).ok_or_else(|| bad("spans", format!("stage {}", c[0])))?;
                v.push(SpanRecord {
                    stage,
                    thread: u32::from_le_bytes([c[1], c[2], c[3], c[4]]),
                    start_ns: u64_at(c, 5),
                    dur_ns: u64_at(c, 13),
                    cpu_ns: u64_at(c, 21),
                    step: u64_at(c, 29),
                    sample: u64_at(c, 37),
                    bytes: u64_at(c, 45),
                    queue_ns: u64_at(c, 53),
                });
            }
            Ok(Frame::Spans(v))
        }
        t => Err(WireError::Tag(t)),
    }
}

/// Reads one frame; the length is checked before the body is allocated.
pub fn read_frame(r: &mut impl Read) -> Result<Frame, WireError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(WireError::Closed),
        Err(e) => return Err(WireError::Io(e.to_string())),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(WireError::Length(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => WireError::Truncated,
        _ => WireError::Io(e.to_string()),
    })?;
    decode(&body)
}

/// The token from [`TOKEN_ENV`], empty when unset (or too long to send).
pub fn env_token() -> String {
    std::env::var(TOKEN_ENV).ok().filter(|t| t.len() <= MAX_TOKEN).unwrap_or_default()
}

/// A handshake: `magic`, [`VERSION`], `token`.
pub fn hello_bytes(magic: &[u8; 4], token: &str) -> Vec<u8> {
    let token = &token.as_bytes()[..token.len().min(MAX_TOKEN)];
    let mut b = magic.to_vec();
    b.extend(VERSION.to_le_bytes());
    b.push(token.len() as u8);
    b.extend_from_slice(token);
    b
}

/// The client's half of the handshake, with the token from [`TOKEN_ENV`].
pub fn client_hello(w: &mut impl Write) -> std::io::Result<()> {
    w.write_all(&hello_bytes(MAGIC, &env_token()))
}

/// The server's check of the client's handshake.
pub fn check_client_hello(r: &mut impl Read) -> Result<(), WireError> {
    match check_peer_hello(r)? {
        Peer::Viewer => Ok(()),
        Peer::Producer => Err(WireError::BadMagic),
    }
}

/// Who opened a connection to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A viewer (`pipeprof attach`): receives the run's frames.
    Viewer,
    /// A producer (a worker process): sends frames into the run.
    Producer,
}

/// A producer's half of the handshake (its [`Frame::Hello`] follows), with the token from
/// [`TOKEN_ENV`].
pub fn producer_hello(w: &mut impl Write) -> std::io::Result<()> {
    w.write_all(&hello_bytes(PRODUCER_MAGIC, &env_token()))
}

/// The server's check of a peer's handshake: a viewer or a producer of this version (its
/// token read and not checked: a Unix socket's permissions decide).
pub fn check_peer_hello(r: &mut impl Read) -> Result<Peer, WireError> {
    check_peer_hello_token(r, None)
}

/// [`check_peer_hello`], and with `token` the peer must have sent exactly it.
pub fn check_peer_hello_token(r: &mut impl Read, token: Option<&str>) -> Result<Peer, WireError> {
    let mut b = [0u8; 6];
    r.read_exact(&mut b).map_err(|_| WireError::Truncated)?;
    let peer = match &b[..4] {
        m if m == MAGIC => Peer::Viewer,
        m if m == PRODUCER_MAGIC => Peer::Producer,
        _ => return Err(WireError::BadMagic),
    };
    let theirs = u16::from_le_bytes([b[4], b[5]]);
    if theirs != VERSION {
        return Err(WireError::Version { theirs });
    }
    let mut n = [0u8; 1];
    r.read_exact(&mut n).map_err(|_| WireError::Truncated)?;
    let n = n[0] as usize;
    if n > MAX_TOKEN {
        return Err(WireError::Token);
    }
    let mut theirs = [0u8; MAX_TOKEN];
    r.read_exact(&mut theirs[..n]).map_err(|_| WireError::Truncated)?;
    if let Some(want) = token {
        // Compared in time independent of where they differ.
        let same = want.len() == n && want.bytes().zip(&theirs[..n]).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        if !same {
            return Err(WireError::Token);
        }
    }
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NONE;

    fn span(i: u64) -> SpanRecord {
        SpanRecord {
            stage: Stage::Resize,
            thread: 7,
            start_ns: i,
            dur_ns: 2 * i,
            cpu_ns: NONE,
            queue_ns: 11,
            step: 3,
            sample: i,
            bytes: 99,
        }
    }

    #[test]
    fn every_frame_kind_round_trips() {
        let frames = vec![
            Frame::Hello(Hello {
                version: VERSION,
                pid: 42,
                program: "train".into(),
                settings: serde_json::json!({"workers": 2}),
                threads: vec![(1, "loader-0".into()), (2, "pool".into())],
                roles: vec![(1, ThreadRole::loader(0))],
                rank: Some(crate::Rank { rank: 1, local_rank: 1, world_size: 2 }),
                dropped: 7,
            }),
            Frame::Spans((0..64).map(span).collect()),
            Frame::Event(WireEvent::Thread { id: 3, name: "train".into(), role: ThreadRole::Train }),
            Frame::Event(WireEvent::Thread { id: 4, name: "pool".into(), role: ThreadRole::Other }),
            Frame::Event(WireEvent::Host(HostSample { t_ns: 5, process_cpu_pct: 150.0, ..Default::default() })),
            Frame::End(ServerStats {
                events_dropped: 1,
                slow_clients_dropped: 2,
                bad_handshakes: 3,
                unencodable_frames: 4,
                connections_refused: 5,
            }),
        ];
        for f in frames {
            let bytes = encode(&f).unwrap();
            assert_eq!(read_frame(&mut &bytes[..]), Ok(f));
        }
    }

    #[test]
    fn a_threads_role_travels_once_with_its_name_and_frames_without_one_still_read() {
        let frame = |json: &str| {
            let mut b = ((json.len() + 1) as u32).to_le_bytes().to_vec();
            b.push(TAG_EVENT);
            b.extend(json.as_bytes());
            read_frame(&mut &b[..])
        };
        // A peer that sends no role (an older producer, a thread without one): Other.
        let old = frame(r#"{"Thread":{"id":3,"name":"loader-0"}}"#);
        let want = WireEvent::Thread { id: 3, name: "loader-0".into(), role: ThreadRole::Other };
        assert_eq!(old, Ok(Frame::Event(want)));
        let typed = frame(r#"{"Thread":{"id":3,"name":"loader-0.2","role":{"loader":{"worker":0,"generation":2}}}}"#);
        let want = WireEvent::Thread {
            id: 3,
            name: "loader-0.2".into(),
            role: ThreadRole::Loader { worker: 0, generation: 2 },
        };
        assert_eq!(typed, Ok(Frame::Event(want)));
        // Other is left out: such a thread's frame is the bytes it was before roles.
        let bytes =
            encode(&Frame::Event(WireEvent::Thread { id: 1, name: "t".into(), role: ThreadRole::Other })).unwrap();
        assert_eq!(&bytes[5..], br#"{"Thread":{"id":1,"name":"t"}}"#);
        // A hello's threads come back as their announcements, roles included.
        let hello = Hello {
            threads: vec![(1, "train".into()), (2, "pool".into())],
            roles: vec![(1, ThreadRole::Train)],
            ..Hello::this_process("p".into(), serde_json::Value::Null)
        };
        let events = hello.thread_events();
        assert_eq!(
            events,
            [
                Event::Thread { id: 1, name: "train".into(), role: ThreadRole::Train },
                Event::Thread { id: 2, name: "pool".into(), role: ThreadRole::Other },
            ]
        );
        let back: Hello =
            serde_json::from_str(r#"{"version":4,"pid":1,"program":"p","settings":null,"threads":[]}"#).unwrap();
        assert!(back.roles.is_empty(), "a hello without roles still reads");
    }

    #[test]
    fn a_diverged_loss_and_non_finite_samples_cross_the_wire() {
        for loss in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e39_f64 as f32] {
            let step = crate::StepRecord {
                no_loss: false,
                step: 410,
                epoch: 0,
                images: 32,
                loss,
                correct: 0,
                end_ns: 9,
                queued: 1,
                validation: false,
            };
            let bytes = encode(&Frame::Event(WireEvent::Step(step))).unwrap();
            match read_frame(&mut &bytes[..]) {
                Ok(Frame::Event(WireEvent::Step(back))) => {
                    assert!(back.loss.is_nan() == loss.is_nan() && (loss.is_nan() || back.loss == loss), "{loss}");
                }
                other => panic!("{loss}: {other:?}"),
            }
        }
        let host = HostSample { global_cpu_pct: f32::NAN, iowait_pct: Some(f32::INFINITY), ..Default::default() };
        let bytes = encode(&Frame::Event(WireEvent::Host(host))).unwrap();
        let Ok(Frame::Event(WireEvent::Host(back))) = read_frame(&mut &bytes[..]) else { panic!("host sample lost") };
        assert!(back.global_cpu_pct.is_nan() && back.iowait_pct == Some(f32::INFINITY));
    }

    #[test]
    fn a_frame_longer_than_the_reader_accepts_is_not_encoded() {
        let long = Frame::Event(WireEvent::Thread { id: 1, name: "x".repeat(MAX_FRAME), role: ThreadRole::Other });
        assert!(matches!(encode(&long), Err(WireError::Length(n)) if n > MAX_FRAME));
        let fits =
            Frame::Event(WireEvent::Thread { id: 1, name: "x".repeat(MAX_FRAME - 100), role: ThreadRole::Other });
        let bytes = encode(&fits).unwrap();
        assert_eq!(read_frame(&mut &bytes[..]), Ok(fits));
    }

    #[test]
    fn hostile_input_is_refused_with_a_reason() {
        let mut too_long = (MAX_FRAME as u32 + 1).to_le_bytes().to_vec();
        too_long.push(TAG_SPANS);
        assert_eq!(read_frame(&mut &too_long[..]), Err(WireError::Length(MAX_FRAME + 1)));
        assert_eq!(read_frame(&mut &[0u8, 0, 0, 0][..]), Err(WireError::Length(0)));
        assert_eq!(read_frame(&mut &[9u8, 0, 0, 0, TAG_EVENT][..]), Err(WireError::Truncated));
        assert_eq!(read_frame(&mut &[][..]), Err(WireError::Closed));
        assert_eq!(decode(&[77]), Err(WireError::Tag(77)));
        assert!(matches!(decode(&[TAG_SPANS, 2, 0, 1]), Err(WireError::Malformed { .. })));
        let mut bad_stage = encode(&Frame::Spans(vec![span(1)])).unwrap();
        bad_stage[7] = 200;
        assert!(matches!(read_frame(&mut &bad_stage[..]), Err(WireError::Malformed { .. })));
        assert!(matches!(decode(&[TAG_EVENT, b'{']), Err(WireError::Malformed { .. })));
        assert_eq!(check_client_hello(&mut &b"HTTP/1"[..]), Err(WireError::BadMagic));
        assert_eq!(check_client_hello(&mut &b"PPRF\x09\x00"[..]), Err(WireError::Version { theirs: 9 }));
        let mut ok = Vec::new();
        client_hello(&mut ok).unwrap();
        assert_eq!(check_client_hello(&mut &ok[..]), Ok(()));
    }

    #[test]
    fn peer_handshake_tells_viewers_from_producers() {
        let (mut v, mut p) = (Vec::new(), Vec::new());
        client_hello(&mut v).unwrap();
        producer_hello(&mut p).unwrap();
        assert_eq!(check_peer_hello(&mut &v[..]), Ok(Peer::Viewer));
        assert_eq!(check_peer_hello(&mut &p[..]), Ok(Peer::Producer));
        assert_eq!(check_peer_hello(&mut &b"PPRX\x01\x00"[..]), Err(WireError::BadMagic));
        assert_eq!(check_peer_hello(&mut &b"PPRP\x07\x00"[..]), Err(WireError::Version { theirs: 7 }));
        assert_eq!(check_peer_hello(&mut &b"PPR"[..]), Err(WireError::Truncated));
        // A producer is not a viewer: the viewer-only check still refuses it.
        assert_eq!(check_client_hello(&mut &p[..]), Err(WireError::BadMagic));
    }

    #[test]
    fn a_tcp_peer_needs_the_runs_token_and_a_unix_one_does_not() {
        let token = "3f9a0c";
        // (what the peer sends, the token the server wants, the outcome)
        let table = [
            (hello_bytes(MAGIC, token), Some(token), Ok(Peer::Viewer)),
            (hello_bytes(PRODUCER_MAGIC, token), Some(token), Ok(Peer::Producer)),
            (hello_bytes(MAGIC, ""), Some(token), Err(WireError::Token)),
            (hello_bytes(PRODUCER_MAGIC, "3f9a0d"), Some(token), Err(WireError::Token)),
            (hello_bytes(MAGIC, "3f9a0c00"), Some(token), Err(WireError::Token)),
            (hello_bytes(MAGIC, ""), None, Ok(Peer::Viewer)),
            (b"PPRF\x04\x00\x05ab".to_vec(), Some(token), Err(WireError::Truncated)),
        ];
        for (bytes, want, outcome) in table {
            assert_eq!(check_peer_hello_token(&mut &bytes[..], want), outcome, "{bytes:?}");
        }
        let mut long = b"PPRF\x04\x00".to_vec();
        long.push(MAX_TOKEN as u8 + 1);
        assert_eq!(check_peer_hello_token(&mut &long[..], Some(token)), Err(WireError::Token));
    }
}

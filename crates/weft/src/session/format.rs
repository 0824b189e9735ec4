//! The session file: a small envelope around a GGUF body.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "WEFTSNAP"
//!      8     4  format version (u32 LE, this weft writes 1)
//!     12     4  reserved, 0
//!     16     8  body length in bytes (u64 LE)
//!     24    32  SHA-256 of the body
//!     56     …  body: a GGUF file (metadata `weft.session.*`, tensors `kv.<layer>.k|v`)
//! ```
//!
//! The KV tensors are stored in the cache's own type: F16, or Q8_0 for a `--kv-type q8_0`
//! cache (`weft.session.kv.type` names it; a file without the key is f16).
//!
//! The body is self-describing (any GGUF tool lists it) and read back with weft's hardened
//! GGUF reader; the checksum catches any damage before a byte of it is trusted, so a flipped
//! bit or a cut file gives a typed error, never a context with wrong keys. A reader accepts
//! every version up to its own and refuses later ones with [`Error::SnapshotVersion`].

use sha2::{Digest, Sha256};
use weft_core::gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};
use weft_core::kv::{GroupSpec, GroupState, KvLayout, KvType, SeqState, PAGE_SIZE};

use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"WEFTSNAP";
/// The format version this weft writes (and the newest it reads).
pub const VERSION: u32 = 1;
const HEADER: usize = 56;

/// Everything a snapshot holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Saved {
    /// The model's fingerprint and architecture name.
    pub fingerprint: String,
    pub arch: String,
    /// The KV cache layout the pages were written in.
    pub layout: KvLayout,
    /// Tokens in the cache, their pages and positions.
    pub tokens: Vec<u32>,
    pub kv: SeqState,
    /// Tokens filled but not run.
    pub pending: Vec<u32>,
    /// The context's random state.
    pub rng: [u64; 4],
    /// A generator in flight, as JSON (see `generator::saved`).
    pub generator: Option<String>,
    /// The tokens ran under custom attention masks: their pages cannot be recomputed from the
    /// tokens alone (`weft.session.attention.custom`; a file without the key: false).
    pub custom_attention: bool,
}

fn corrupt(reason: impl Into<String>) -> Error {
    Error::SnapshotCorrupt {
        reason: reason.into(),
    }
}

const KEY: &str = "weft.session";

/// The GGUF tensor type of a KV cache type.
fn ggml_type(kv: KvType) -> GgmlType {
    match kv {
        KvType::F16 => GgmlType::F16,
        KvType::Q8_0 => GgmlType::Q8_0,
    }
}

/// Serializes `s` (envelope and body).
pub(crate) fn encode(s: &Saved) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{KEY}.{k}");
    let u32s = |v: &[u32]| Value::Array(Array::U32(v.to_vec()));
    w.metadata("general.type", Value::String("weft.session".into()));
    w.metadata(
        &key("model.fingerprint"),
        Value::String(s.fingerprint.clone()),
    );
    w.metadata(&key("model.architecture"), Value::String(s.arch.clone()));
    w.metadata(&key("kv.page_size"), Value::U32(PAGE_SIZE as u32));
    w.metadata(&key("kv.n_layers"), Value::U32(s.layout.n_layers as u32));
    w.metadata(
        &key("kv.n_kv_heads"),
        Value::U32(s.layout.n_kv_heads as u32),
    );
    w.metadata(&key("kv.head_dim"), Value::U32(s.layout.head_dim as u32));
    w.metadata(
        &key("kv.type"),
        Value::String(s.layout.kv_type.name().into()),
    );
    let dtype = ggml_type(s.layout.kv_type);
    w.metadata(
        &key("kv.n_groups"),
        Value::U32(s.layout.groups.len() as u32),
    );
    for (g, (spec, gs)) in s.layout.groups.iter().zip(&s.kv.groups).enumerate() {
        let layers: Vec<u32> = spec.layers.iter().map(|&l| l as u32).collect();
        w.metadata(&key(&format!("kv.group.{g}.layers")), u32s(&layers));
        let window = spec.window.map_or(0, |w| w as u64);
        w.metadata(&key(&format!("kv.group.{g}.window")), Value::U64(window));
        let present: Vec<u8> = gs.present.iter().map(|&p| u8::from(p)).collect();
        w.metadata(
            &key(&format!("kv.group.{g}.present")),
            Value::Array(Array::U8(present)),
        );
        let held = gs.present.iter().filter(|&&p| p).count() as u64;
        if held == 0 {
            continue;
        }
        let shape = [
            s.layout.head_dim as u64,
            PAGE_SIZE as u64,
            s.layout.n_kv_heads as u64,
            held,
        ];
        for (li, &l) in spec.layers.iter().enumerate() {
            for (name, data) in [("k", &gs.keys[li]), ("v", &gs.values[li])] {
                w.tensor(&format!("kv.{l}.{name}"), dtype, &shape, data.clone());
            }
        }
    }
    w.metadata(&key("tokens"), u32s(&s.tokens));
    w.metadata(&key("positions"), u32s(&s.kv.positions));
    w.metadata(&key("pending"), u32s(&s.pending));
    w.metadata(&key("rng"), Value::Array(Array::U64(s.rng.to_vec())));
    if let Some(g) = &s.generator {
        w.metadata(&key("generator"), Value::String(g.clone()));
    }
    if s.custom_attention {
        w.metadata(&key("attention.custom"), Value::Bool(true));
    }
    let body = w.to_bytes();
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&body));
    out.extend_from_slice(&body);
    out
}

/// Parses and checks a snapshot (envelope, checksum, structure). The fingerprint and layout
/// are compared with the engine's by the caller.
pub(crate) fn decode(bytes: &[u8]) -> Result<Saved> {
    if bytes.len() < HEADER {
        if bytes.len() >= 8 && &bytes[..8] != MAGIC {
            return Err(corrupt("not a weft snapshot (wrong magic bytes)"));
        }
        return Err(corrupt(format!(
            "truncated: {} bytes, shorter than the {HEADER}-byte header",
            bytes.len()
        )));
    }
    let (header, body) = bytes.split_at(HEADER);
    if &header[..8] != MAGIC {
        return Err(corrupt("not a weft snapshot (wrong magic bytes)"));
    }
    let word = |at: usize| {
        u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let version = word(8);
    if version == 0 || version > VERSION {
        return Err(Error::SnapshotVersion {
            found: version,
            supported: VERSION,
        });
    }
    if word(12) != 0 {
        return Err(corrupt("reserved header field is not zero"));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&header[16..24]);
    let len = u64::from_le_bytes(len);
    if len != body.len() as u64 {
        return Err(corrupt(format!(
            "truncated or padded: the header announces {len} body bytes, {} follow",
            body.len()
        )));
    }
    if Sha256::digest(body).as_slice() != &header[24..56] {
        return Err(corrupt("checksum mismatch: the file was damaged"));
    }
    // Version 1 is the only one so far; later versions add their readers here.
    read_v1(body)
}

fn read_v1(body: &[u8]) -> Result<Saved> {
    let file = GgufFile::from_bytes(body.to_vec()).map_err(|e| corrupt(e.to_string()))?;
    let key = |k: &str| format!("{KEY}.{k}");
    let string = |k: &str| -> Result<String> {
        Ok(file
            .get_str(&key(k))
            .map_err(|e| corrupt(e.to_string()))?
            .to_string())
    };
    let number = |k: &str| -> Result<usize> {
        let v = file.get_u64(&key(k)).map_err(|e| corrupt(e.to_string()))?;
        usize::try_from(v).map_err(|_| corrupt(format!("{k} out of range")))
    };
    let u32s = |k: &str| -> Result<Vec<u32>> {
        match file
            .get_array(&key(k))
            .map_err(|e| corrupt(e.to_string()))?
        {
            Array::U32(v) => Ok(v.clone()),
            other => Err(corrupt(format!(
                "{k}: expected u32 values, found {}",
                other.element_type_name()
            ))),
        }
    };
    if file.opt_str("general.type").ok().flatten() != Some("weft.session") {
        return Err(corrupt("the body is not a weft session"));
    }
    if number("kv.page_size")? != PAGE_SIZE {
        return Err(corrupt("KV page size differs from this weft's"));
    }
    let (n_layers, n_kv_heads, head_dim) = (
        number("kv.n_layers")?,
        number("kv.n_kv_heads")?,
        number("kv.head_dim")?,
    );
    let kv_type: KvType = match file.get(&key("kv.type")) {
        None => KvType::F16,
        Some(_) => string("kv.type")?.parse().map_err(corrupt)?,
    };
    if !kv_type.fits(head_dim) {
        return Err(corrupt(format!(
            "a {kv_type} KV cache cannot hold heads of {head_dim}"
        )));
    }
    let n_groups = number("kv.n_groups")?;
    if n_groups > n_layers.max(1) {
        return Err(corrupt("more layer groups than layers"));
    }
    let positions = u32s("positions")?;
    let n_pages = positions.len().div_ceil(PAGE_SIZE);
    let page_bytes = PAGE_SIZE
        .checked_mul(n_kv_heads)
        .and_then(|n| n.checked_mul(kv_type.row_bytes(head_dim)))
        .ok_or_else(|| corrupt("KV shape overflows"))?;
    let mut groups = Vec::with_capacity(n_groups);
    let mut states = Vec::with_capacity(n_groups);
    for g in 0..n_groups {
        let layers: Vec<usize> = u32s(&format!("kv.group.{g}.layers"))?
            .into_iter()
            .map(|l| l as usize)
            .collect();
        if layers.iter().any(|&l| l >= n_layers) {
            return Err(corrupt(format!("group {g} names a layer past {n_layers}")));
        }
        let window = number(&format!("kv.group.{g}.window"))?;
        let present: Vec<bool> = match file
            .get_array(&key(&format!("kv.group.{g}.present")))
            .map_err(|e| corrupt(e.to_string()))?
        {
            Array::U8(v) => v.iter().map(|&b| b != 0).collect(),
            _ => return Err(corrupt(format!("group {g}: page flags are not u8"))),
        };
        if present.len() != n_pages {
            return Err(corrupt(format!(
                "group {g}: {} page flags for {} slots",
                present.len(),
                positions.len()
            )));
        }
        let held = present.iter().filter(|&&p| p).count();
        let expected_shape = [
            head_dim as u64,
            PAGE_SIZE as u64,
            n_kv_heads as u64,
            held as u64,
        ];
        let mut keys = Vec::with_capacity(layers.len());
        let mut values = Vec::with_capacity(layers.len());
        for &l in &layers {
            for (name, out) in [("k", &mut keys), ("v", &mut values)] {
                if held == 0 {
                    out.push(Vec::new());
                    continue;
                }
                let tname = format!("kv.{l}.{name}");
                let info = file
                    .tensor(&tname)
                    .map_err(|_| corrupt(format!("it has no tensor {tname}")))?;
                if info.dtype != ggml_type(kv_type) || info.shape != expected_shape {
                    return Err(corrupt(format!(
                        "tensor {tname} has the wrong type or shape"
                    )));
                }
                let data = file.tensor_data(info);
                if Some(data.len()) != held.checked_mul(page_bytes) {
                    return Err(corrupt(format!("tensor {tname} has the wrong size")));
                }
                out.push(data.to_vec());
            }
        }
        groups.push(GroupSpec {
            layers,
            window: (window > 0).then_some(window),
        });
        states.push(GroupState {
            present,
            keys,
            values,
        });
    }
    let tokens = u32s("tokens")?;
    if tokens.len() != positions.len() {
        return Err(corrupt(format!(
            "{} tokens but {} positions",
            tokens.len(),
            positions.len()
        )));
    }
    let rng = match file
        .get_array(&key("rng"))
        .map_err(|e| corrupt(e.to_string()))?
    {
        Array::U64(v) if v.len() == 4 => [v[0], v[1], v[2], v[3]],
        _ => return Err(corrupt("random state is not four u64 values")),
    };
    if rng == [0; 4] {
        // xoshiro's one state that never leaves zero: every draw would be the same.
        return Err(corrupt("random state is all zeros"));
    }
    let generator = match file.get(&key("generator")) {
        None => None,
        Some(_) => Some(string("generator")?),
    };
    Ok(Saved {
        fingerprint: string("model.fingerprint")?,
        arch: string("model.architecture")?,
        layout: KvLayout {
            n_layers,
            n_kv_heads,
            head_dim,
            groups,
            kv_type,
        },
        tokens,
        kv: SeqState {
            positions,
            kv_type,
            groups: states,
        },
        pending: u32s("pending")?,
        rng,
        generator,
        custom_attention: file
            .opt_bool(&key("attention.custom"))
            .map_err(|e| corrupt(e.to_string()))?
            .unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(kv_type: KvType) -> Saved {
        let layout = KvLayout {
            n_layers: 2,
            n_kv_heads: 1,
            head_dim: 32,
            groups: vec![
                GroupSpec {
                    layers: vec![0],
                    window: None,
                },
                GroupSpec {
                    layers: vec![1],
                    window: Some(32),
                },
            ],
            kv_type,
        };
        let n = layout.page_bytes();
        let page = |seed: u8| (0..n).map(|i| i as u8 ^ seed).collect::<Vec<_>>();
        Saved {
            fingerprint: "sha256:00ff".into(),
            arch: "llama".into(),
            layout,
            tokens: (0..40).collect(),
            kv: SeqState {
                positions: (0..40).collect(),
                kv_type,
                groups: vec![
                    GroupState {
                        present: vec![true, true],
                        keys: vec![[page(1), page(2)].concat()],
                        values: vec![[page(3), page(4)].concat()],
                    },
                    GroupState {
                        present: vec![false, true],
                        keys: vec![page(5)],
                        values: vec![page(6)],
                    },
                ],
            },
            pending: vec![7, 8],
            rng: [1, 2, 3, 4],
            generator: Some("{}".into()),
            custom_attention: kv_type == KvType::Q8_0,
        }
    }

    #[test]
    fn round_trip() {
        for kv_type in [KvType::F16, KvType::Q8_0] {
            let s = sample(kv_type);
            assert_eq!(decode(&encode(&s)).unwrap(), s);
        }
    }

    #[test]
    fn versions_and_damage_are_typed_errors() {
        let bytes = encode(&sample(KvType::F16));
        let mut newer = bytes.clone();
        newer[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert!(matches!(
            decode(&newer),
            Err(Error::SnapshotVersion {
                found: 2,
                supported: 1
            })
        ));
        let mut flipped = bytes.clone();
        let at = bytes.len() - 3;
        flipped[at] ^= 0x10;
        assert!(matches!(
            decode(&flipped),
            Err(Error::SnapshotCorrupt { .. })
        ));
        for cut in [0, 7, 30, 56, bytes.len() - 1] {
            assert!(matches!(
                decode(&bytes[..cut]),
                Err(Error::SnapshotCorrupt { .. })
            ));
        }
        // A well-sealed file whose random state is all zeros (a generator stuck at zero).
        let mut stuck = sample(KvType::F16);
        stuck.rng = [0; 4];
        let e = decode(&encode(&stuck)).unwrap_err();
        assert!(e.to_string().contains("all zeros"), "{e}");
    }
}

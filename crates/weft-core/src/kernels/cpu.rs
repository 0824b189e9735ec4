//! What the CPU is, beyond its instruction sets (vendor, family: CPUID), and the two kernel
//! choices measured per CPU that depend on it: whether a one-token product takes the AVX-512
//! pair tiles ([`one_token_pairs`]), and whether the 256-bit interleaved tiles hint their
//! weights ahead ([`weight_prefetch`]). Each has an environment variable that decides instead,
//! for comparisons on other CPUs.

#[cfg(test)]
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// Whether a one-token product (a decode step's matrix-vector product) on the `avx512` level
/// takes the 512-bit pair tiles, two row groups per call, rather than the 256-bit EVEX tiles,
/// one group per call; products of several tokens always take the pairs. Both give the same
/// bits.
///
/// Measured (`weft bench -p 0 -n 128`, alternating runs): on an Intel Xeon (model 167) the pair
/// tiles took SmolLM2's decode 10–13% higher than the 256-bit ones; on an AMD EPYC Zen 4
/// (family 25, model 17) 25–35% lower for both models (SmolLM2 212–249 against 302–340 t/s,
/// Gemma 3 102–108 against 127–155), while the prefill's several-token products gained from
/// them there too. So the pairs are used for one token except on AMD CPUs; the environment
/// variable `WEFT_PAIR_GEMV=1` or `0` decides instead (for comparisons).
pub fn one_token_pairs() -> bool {
    static PAIRS: OnceLock<bool> = OnceLock::new();
    *PAIRS.get_or_init(|| env_switch("WEFT_PAIR_GEMV", || !cpu_is_amd()))
}

/// The environment variable `name` as a switch: `1` on, `0` off, else (unset, or any other
/// value, which is reported) `default()`.
fn env_switch(name: &str, default: impl FnOnce() -> bool) -> bool {
    match std::env::var(name).as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        other => {
            if let Ok(v) = other {
                eprintln!("weft: {name}={v:?} ignored: the choices are 0 and 1");
            }
            default()
        }
    }
}

/// Whether the CPU is AMD's (its vendor string, CPUID leaf 0, is `AuthenticAMD`).
fn cpu_is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID leaf 0 exists on every x86-64 CPU.
        #[allow(unused_unsafe)]
        let id = unsafe { std::arch::x86_64::__cpuid(0) };
        let mut vendor = [0u8; 12];
        for (i, r) in [id.ebx, id.edx, id.ecx].into_iter().enumerate() {
            vendor[4 * i..4 * i + 4].copy_from_slice(&r.to_le_bytes());
        }
        &vendor == b"AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the 256-bit interleaved tiles (one group of 8 rows; a decode step's products on AMD
/// CPUs, see [`one_token_pairs`], and every product below AVX-512) hint each step's weight
/// lines `PREFETCH_BYTES` ahead into L1 (`x86::prefetch_ahead`), or leave the weights to the
/// hardware prefetchers. The hints change no result, only how far ahead the loads are asked.
///
/// On an Intel Xeon (model 167) hinting every line a step reads took SmolLM2's tg128 from
/// 69–71% of the measured bus to 84–91%. On an AMD EPYC Zen 4 (family 25, model 17) the hints
/// cost: in the cold-weights micro-benchmark (`kernels::bench::bench_weight_prefetch`, the two
/// settings alternated within each of 6 rounds; medians) the Q4_1 product streamed 21.9
/// against 18.0 GB/s on one thread and 30.2 against 27.0 on two, SmolLM2's Q8_0 LM head 43.6
/// against 37.5 on two; `weft bench` (tg64, alternating processes, 6 pairs a model) decoded SmolLM2
/// 12–19% and Gemma 3 5–29% faster without them, every pair, and at depth 4,096 11–37%. The
/// AVX-512 pair tiles keep their hints there (without them Gemma's 16 parallel decodes lost
/// 7–13%). So the hints are off on Zen 4 (AMD family 25 with AVX-512) and on elsewhere;
/// `WEFT_WEIGHT_PREFETCH=0` or `1` decides instead. Zen 3, the same family without AVX-512,
/// streams faster with them (the same micro-benchmark on a family 25 model 1: Q4_1 13.6
/// against 11.4 GB/s on one thread, 19.9 against 17.4 on two; Gemma 3's LM head 27.4 against
/// 25.4 on two). Zen 5 (family 26) was not measured.
pub fn weight_prefetch() -> bool {
    #[cfg(test)]
    match PREFETCH_OVERRIDE.load(Ordering::Relaxed) {
        OFF => return false,
        ON => return true,
        _ => {}
    }
    static DECIDED: OnceLock<bool> = OnceLock::new();
    *DECIDED.get_or_init(|| env_switch("WEFT_WEIGHT_PREFETCH", || !cpu_is_zen4()))
}

/// [`weight_prefetch`]'s answer while a micro-benchmark compares the two in one process:
/// `UNSET` (the CPU's choice), `OFF` or `ON`. Test builds only: a release build's tiles read
/// the decision alone.
#[cfg(test)]
static PREFETCH_OVERRIDE: AtomicU8 = AtomicU8::new(UNSET);
#[cfg(test)]
const UNSET: u8 = 0;
#[cfg(test)]
const OFF: u8 = 1;
#[cfg(test)]
const ON: u8 = 2;

/// Makes [`weight_prefetch`] answer `on` (`None`: the CPU's choice again), for the
/// micro-benchmark that alternates the two.
#[cfg(test)]
pub(crate) fn force_weight_prefetch(on: Option<bool>) {
    let v = match on {
        None => UNSET,
        Some(false) => OFF,
        Some(true) => ON,
    };
    PREFETCH_OVERRIDE.store(v, Ordering::Relaxed);
}

/// Whether the CPU is an AMD Zen 4: AMD's, family 25 (0x19, shared with Zen 3), with AVX-512.
fn cpu_is_zen4() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID leaf 1 exists on every x86-64 CPU.
        #[allow(unused_unsafe)]
        let eax = unsafe { std::arch::x86_64::__cpuid(1) }.eax;
        cpu_is_amd() && family_model(eax).0 == 0x19 && is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The family and model in CPUID leaf 1's `eax`, as Intel's and AMD's manuals define them:
/// the extended family is added when the base family is 15, and the extended model is the
/// high nibble of the model when the base family is 6 or 15.
fn family_model(eax: u32) -> (u32, u32) {
    let (base_family, base_model) = ((eax >> 8) & 0xF, (eax >> 4) & 0xF);
    let (ext_family, ext_model) = ((eax >> 20) & 0xFF, (eax >> 16) & 0xF);
    let family = if base_family == 0xF {
        base_family + ext_family
    } else {
        base_family
    };
    let model = if base_family == 0x6 || base_family == 0xF {
        (ext_model << 4) | base_model
    } else {
        base_model
    };
    (family, model)
}

#[cfg(test)]
mod tests {
    use super::family_model;

    /// Leaf 1 signatures: an AMD EPYC 9004 "Genoa" (Zen 4, family 0x19 model 0x11, as
    /// `/proc/cpuinfo` names this project's Zen 4 guests: family 25, model 17), a 7003 "Milan"
    /// (Zen 3, the same family), a Zen 5 (family 0x1A) and an Intel Xeon "Sapphire Rapids".
    #[test]
    fn family_and_model_from_the_signature() {
        assert_eq!(family_model(0x00A1_0F11), (0x19, 0x11));
        assert_eq!(family_model(0x00A0_0F11), (0x19, 0x01));
        assert_eq!(family_model(0x00B0_0F21), (0x1A, 0x02));
        assert_eq!(family_model(0x0008_06F8), (0x6, 0x8F));
    }
}

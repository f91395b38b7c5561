//! The instruction sets the kernels are compiled for, chosen at run time.
//!
//! An [`Isa`] can only be made by asking the CPU ([`Isa::detect`],
//! [`Isa::get`], [`Isa::available`]): holding one is the proof that the
//! CPU runs its instructions, which is what makes the kernels' `unsafe`
//! calls of `#[target_feature]` functions sound.

/// The kinds of instruction set a kernel can be written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IsaKind {
    /// AVX-512F: 16-wide f32 vectors, 32 registers.
    Avx512,
    /// AVX2 with FMA and F16C (f16 → f32 conversion; every AVX2 CPU
    /// made has it, one without falls back to portable): 8-wide f32
    /// vectors, 16 registers.
    Avx2,
    /// Plain code, whatever the compiler makes of it.
    Portable,
}

/// The environment variable that caps the instruction set the kernels use
/// (as oneDNN's `ONEDNN_MAX_CPU_ISA`): one of [`ISA_NAMES`]; the widest this
/// CPU runs by default. For comparing paths on one machine, and for ruling a
/// kernel out when a result looks wrong.
const MAX_ISA_VAR: &str = "INFERSCOPE_MAX_CPU_ISA";

/// The values of [`MAX_ISA_VAR`], narrowest first: plain code, AVX2 (with
/// FMA and F16C), AVX2 with AVX-VNNI's integer products, AVX-512.
const ISA_NAMES: [&str; 4] = ["portable", "avx2", "avx2_vnni", "avx512"];

/// The rank of an [`ISA_NAMES`] entry (case and `-`/`_` ignored).
fn rank_of(name: &str) -> Option<usize> {
    let name = name.trim().to_ascii_lowercase().replace('-', "_");
    ISA_NAMES.iter().position(|n| *n == name)
}

/// Which instruction the integer K-quant and Q8_0 tiles take for their sums
/// of four u8 × i8 products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dot {
    /// `vpmaddubsw` + `vpmaddwd` (AVX2).
    Maddubs,
    /// AVX-VNNI's `vpdpbusd` (VEX: CPUs with AVX2 and AVX-VNNI but no
    /// AVX-512, Alder Lake and later client cores; 16 registers, the AVX2
    /// tiles' shapes).
    AvxVnni,
    /// AVX512-VNNI's `vpdpbusd` on 256-bit vectors (AVX512VL: 32 registers,
    /// taller tiles).
    Avx512Vnni,
}

/// An instruction set this CPU runs, and the dot product its integer tiles
/// take. The fields are private to this module, so no other code can make
/// one for a CPU that lacks the features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Isa(IsaKind, Dot);

impl IsaKind {
    /// Whether this CPU runs it (the detection macro caches its answer:
    /// this is a load and a test).
    fn runs(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Self::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
                Self::Avx2 => {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                        && std::arch::is_x86_feature_detected!("f16c")
                }
                Self::Portable => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Self::Portable
        }
    }
}

impl Isa {
    /// `kind`, if this CPU runs it: AVX-512 with AVX512-VNNI's dot products
    /// where the CPU has them, the others with `maddubs`.
    pub(crate) fn get(kind: IsaKind) -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        let avx512_vnni = kind == IsaKind::Avx512
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl");
        #[cfg(not(target_arch = "x86_64"))]
        let avx512_vnni = false;
        let dot = if avx512_vnni {
            Dot::Avx512Vnni
        } else {
            Dot::Maddubs
        };
        kind.runs().then_some(Self(kind, dot))
    }

    /// AVX2 with AVX-VNNI's dot products, if this CPU runs both.
    fn avx2_with_avx_vnni() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            let vnni = std::arch::is_x86_feature_detected!("avxvnni");
            Self::get(IsaKind::Avx2)
                .filter(|_| vnni)
                .map(|i| Self(i.0, Dot::AvxVnni))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            None
        }
    }

    /// Every one this CPU runs, narrowest first (the tests run each: AVX2
    /// with and without AVX-VNNI where the CPU has it, so both integer
    /// paths stay checked).
    fn runnable() -> impl Iterator<Item = Self> {
        [
            Self::get(IsaKind::Portable),
            Self::get(IsaKind::Avx2),
            Self::avx2_with_avx_vnni(),
            Self::get(IsaKind::Avx512),
        ]
        .into_iter()
        .flatten()
    }

    /// The widest one this CPU runs, at most the one named by
    /// `INFERSCOPE_MAX_CPU_ISA` (read once; see [`MAX_ISA_VAR`]).
    pub(crate) fn detect() -> Self {
        static DETECTED: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            let cap = std::env::var(MAX_ISA_VAR).ok();
            let isa = Self::widest(cap.as_deref().and_then(|v| match rank_of(v) {
                Some(rank) => Some(rank),
                None => {
                    tracing::warn!(
                        "{MAX_ISA_VAR}={v:?} is not one of {}: ignored",
                        ISA_NAMES.join(", ")
                    );
                    None
                }
            }));
            if let Some(v) = cap {
                tracing::info!("{MAX_ISA_VAR}={v}: the kernels use {}", isa.name());
            }
            isa
        })
    }

    /// The widest one this CPU runs whose rank (in [`ISA_NAMES`]) is at most
    /// `cap`.
    fn widest(cap: Option<usize>) -> Self {
        let within = |isa: &Isa| cap.is_none_or(|c| isa.rank() <= c);
        (Self::runnable().filter(within).last()).expect("portable code always runs")
    }

    /// Its place in [`ISA_NAMES`], narrowest first.
    fn rank(self) -> usize {
        match (self.0, self.1) {
            (IsaKind::Portable, _) => 0,
            (IsaKind::Avx2, Dot::Maddubs) => 1,
            (IsaKind::Avx2, Dot::AvxVnni) => 2,
            // AVX2 with AVX512-VNNI is AVX-512's quantized tiles.
            (IsaKind::Avx512, _) | (IsaKind::Avx2, Dot::Avx512Vnni) => 3,
        }
    }

    /// Its name in [`ISA_NAMES`].
    fn name(self) -> &'static str {
        ISA_NAMES[self.rank()]
    }

    /// Every one this CPU runs, narrowest first (the tests run each).
    #[cfg(test)]
    pub(crate) fn available() -> impl Iterator<Item = Self> {
        Self::runnable()
    }

    /// Which one it is.
    pub(crate) fn kind(self) -> IsaKind {
        self.0
    }

    /// The dot product of its integer K-quant and Q8_0 tiles.
    pub(crate) fn dot(self) -> Dot {
        self.1
    }

    /// The one the quantized tiles run under: AVX-512 CPUs run the AVX2
    /// tiles (256-bit), keeping AVX512-VNNI's dot products where the CPU
    /// has them (detected with AVX-512, so the CPU runs them).
    pub(crate) fn for_quantized_tiles(self) -> Self {
        match self.0 {
            IsaKind::Avx512 => Self::get(IsaKind::Avx2).map_or(self, |avx2| Self(avx2.0, self.1)),
            _ => self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_names_an_isa_and_is_never_exceeded() {
        assert_eq!(rank_of("AVX2-VNNI"), Some(2));
        assert_eq!(rank_of(" portable "), Some(0));
        assert_eq!(rank_of("sse4"), None);
        let all: Vec<Isa> = Isa::available().collect();
        for (cap, name) in ISA_NAMES.iter().enumerate() {
            let isa = Isa::widest(Some(cap));
            assert!(isa.rank() <= cap, "{isa:?} over {name}");
            // The widest this CPU runs within the cap.
            let best = all
                .iter()
                .filter(|i| i.rank() <= cap)
                .map(|i| i.rank())
                .max();
            assert_eq!(Some(isa.rank()), best, "cap {name}");
        }
        assert_eq!(Isa::widest(None), Isa::widest(Some(ISA_NAMES.len() - 1)));
        assert_eq!(Isa::widest(Some(0)).name(), "portable");
    }

    #[test]
    fn only_what_the_cpu_runs() {
        assert_eq!(
            Isa::get(IsaKind::Portable).map(Isa::kind),
            Some(IsaKind::Portable)
        );
        for kind in [IsaKind::Avx512, IsaKind::Avx2] {
            assert_eq!(Isa::get(kind).is_some(), kind.runs(), "{kind:?}");
        }
        assert!(Isa::available().any(|i| i == Isa::detect()));
        #[cfg(target_arch = "x86_64")]
        {
            let vnni = std::arch::is_x86_feature_detected!("avxvnni") && IsaKind::Avx2.runs();
            let with: Vec<Isa> = Isa::available()
                .filter(|i| i.dot() == Dot::AvxVnni)
                .collect();
            assert_eq!(with.len(), usize::from(vnni), "{with:?}");
            assert!(with.iter().all(|i| i.kind() == IsaKind::Avx2));
        }
    }
}

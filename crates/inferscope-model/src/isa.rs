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

/// An instruction set this CPU runs. The field is private to this module,
/// so no other code can make one for a CPU that lacks the features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Isa(IsaKind);

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
    /// `kind`, if this CPU runs it.
    pub(crate) fn get(kind: IsaKind) -> Option<Self> {
        kind.runs().then_some(Self(kind))
    }

    /// The widest one this CPU runs.
    pub(crate) fn detect() -> Self {
        [IsaKind::Avx512, IsaKind::Avx2]
            .into_iter()
            .find_map(Self::get)
            .unwrap_or(Self(IsaKind::Portable))
    }

    /// Every one this CPU runs, narrowest first (the tests run each).
    #[cfg(test)]
    pub(crate) fn available() -> impl Iterator<Item = Self> {
        [IsaKind::Portable, IsaKind::Avx2, IsaKind::Avx512]
            .into_iter()
            .filter_map(Self::get)
    }

    /// Which one it is.
    pub(crate) fn kind(self) -> IsaKind {
        self.0
    }

    /// Whether the integer K-quant and Q8_0 products take AVX512-VNNI's
    /// `vpdpbusd` (on 256-bit vectors): only under [`IsaKind::Avx512`], so that the
    /// tests, which run every ISA this CPU has, check the AVX2 integer paths
    /// (under [`IsaKind::Avx2`]) and the VNNI ones both.
    pub(crate) fn vnni(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self.0 == IsaKind::Avx512
                && std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512vl")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}

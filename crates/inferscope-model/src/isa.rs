//! The instruction sets the kernels are compiled for, chosen at run time.

/// An instruction set a kernel can run with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Isa {
    /// AVX-512F: 16-wide f32 vectors, 32 registers.
    Avx512,
    /// AVX2 with FMA: 8-wide f32 vectors, 16 registers.
    Avx2,
    /// Plain code, whatever the compiler makes of it.
    Portable,
}

impl Isa {
    /// Whether this CPU runs it (the detection macro caches its answer:
    /// this is a load and a test).
    pub(crate) fn runs(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Self::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
                Self::Avx2 => {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                }
                Self::Portable => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Self::Portable
        }
    }

    /// The widest one this CPU runs.
    pub(crate) fn detect() -> Self {
        [Self::Avx512, Self::Avx2]
            .into_iter()
            .find(|i| i.runs())
            .unwrap_or(Self::Portable)
    }
}

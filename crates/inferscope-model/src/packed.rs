//! Dense weights packed for the products a decode step does: `y = x Wᵀ`
//! with a few to a few hundred rows of `x`.
//!
//! `W` (`[out][in]`, row-major as checkpoints store it) is kept as panels of
//! [`LANES`] output rows interleaved along `in` — `[out / LANES][in][LANES]`
//! — so the kernel reads each panel as one sequential stream and multiplies
//! a vector of `LANES` weights by one broadcast element of `x`, accumulating
//! a tile of `MR` rows × `NV` panels in registers (a BLIS-style
//! micro-kernel without packing `x`, which is small). The same layout serves
//! batch 1 — where the product is bound by reading the weights once — and
//! batch 32, where it is bound by the multiply-adds; a general GEMM spends
//! much of such small products packing its operands.

use std::ops::Range;

use half::f16;
use rayon::prelude::*;

use crate::isa::{Isa, IsaKind};

/// Output rows per panel: one AVX-512 (or two AVX2) vectors of f32.
pub(crate) const LANES: usize = 16;

/// Most rows of `x` in one register tile.
pub(crate) const MAX_MR: usize = 6;

/// Below this many multiply-adds one thread does the product: a parallel
/// section costs a synchronisation, and on a loaded machine waiting for a
/// descheduled worker costs far more than the work. At 512 Ki a one-row
/// product of a 768-wide model's q/k/v and o (0.6–1 M multiply-adds, 18 %
/// of a decode step) splits: one thread cannot pull the memory bandwidth
/// two can, and a one-row integer product is bound by its unpacking.
pub(crate) const PARALLEL_MIN_MACS: usize = 1 << 19;

/// Multiply-adds per parallel task, so that tasks outnumber threads enough
/// to balance without each paying more in scheduling than it computes.
const TASK_MACS: usize = 1 << 18;

/// How a packed weight's elements are stored (the products are f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    /// 4 bytes per weight.
    F32,
    /// bfloat16, 2 bytes per weight: half the memory and half the bytes
    /// read per decode step; widened to f32 as it is loaded.
    Bf16,
    /// IEEE half precision, 2 bytes per weight (GGUF's F16): widened to f32
    /// exactly as it is loaded (F16C `vcvtph2ps` on x86).
    F16,
}

/// The panels, `[panels][inp][LANES]`, in one of the storage types.
#[derive(Clone)]
enum Panels {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    F16(Vec<f16>),
}

/// A run of panels borrowed for a tile.
#[derive(Clone, Copy)]
enum PanelSlice<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    F16(&'a [f16]),
}

impl PanelSlice<'_> {
    fn len(&self) -> usize {
        match self {
            Self::F32(w) => w.len(),
            Self::Bf16(w) => w.len(),
            Self::F16(w) => w.len(),
        }
    }
}

impl Panels {
    fn slice(&self, r: Range<usize>) -> PanelSlice<'_> {
        match self {
            Self::F32(w) => PanelSlice::F32(&w[r]),
            Self::Bf16(w) => PanelSlice::Bf16(&w[r]),
            Self::F16(w) => PanelSlice::F16(&w[r]),
        }
    }

    fn get(&self, i: usize) -> f32 {
        match self {
            Self::F32(w) => w[i],
            Self::Bf16(w) => w[i].widen(),
            Self::F16(w) => w[i].widen(),
        }
    }
}

/// How a kernel widens a weight element to f32.
#[derive(PartialEq, Eq)]
enum Widen {
    /// Already f32.
    None,
    /// bf16 bits, shifted into the high half of an f32.
    Bf16,
    /// IEEE half, converted (F16C on x86).
    F16,
}

/// A weight element the kernels read: f32, bf16 kept as its bits, or f16.
trait Elem: Copy + Send + Sync {
    /// How it becomes f32.
    const WIDEN: Widen;
    /// The value as f32.
    fn widen(self) -> f32;
}

impl Elem for f32 {
    const WIDEN: Widen = Widen::None;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Elem for u16 {
    const WIDEN: Widen = Widen::Bf16;
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }
}

impl Elem for f16 {
    const WIDEN: Widen = Widen::F16;
    #[inline(always)]
    fn widen(self) -> f32 {
        // Exact: every f16 is an f32.
        self.to_f32()
    }
}

/// `w` (`[out][inp]`, row-major) rearranged into panels, `[panels][inp][LANES]`,
/// the rows past `out` in the last panel zero.
fn panelize<T: Copy + Default>(w: &[T], out: usize, inp: usize) -> Vec<T> {
    assert_eq!(w.len(), out * inp, "weight is not [{out}][{inp}]");
    let panels = out.div_ceil(LANES);
    let mut data = vec![T::default(); panels * inp * LANES];
    for (o, row) in w.chunks_exact(inp.max(1)).enumerate().take(out) {
        let panel = &mut data[(o / LANES) * inp * LANES..][..inp * LANES];
        for (k, &v) in row.iter().enumerate() {
            panel[k * LANES + o % LANES] = v;
        }
    }
    data
}

/// `x` rounded to the nearest bfloat16 (ties to even), as its bits.
pub fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        // Keep it a (quiet) NaN whatever its low bits were.
        return ((b >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// A dense `[out][in]` weight in panel layout.
#[derive(Clone)]
pub struct PackedWeight {
    /// `[panels][inp][LANES]`; rows past `out` in the last panel are zero.
    data: Panels,
    out: usize,
    inp: usize,
}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedWeight[{}, {}]", self.out, self.inp)
    }
}

impl PackedWeight {
    /// Packs a row-major `[out][inp]` matrix, kept in f32.
    pub fn pack(w: &[f32], out: usize, inp: usize) -> Self {
        Self::pack_as(w, out, inp, WeightDtype::F32)
    }

    /// Packs a row-major `[out][inp]` matrix, stored as `dtype`.
    /// F16 rounds to nearest even (`half`), as bf16 does.
    pub fn pack_as(w: &[f32], out: usize, inp: usize, dtype: WeightDtype) -> Self {
        let data = panelize(w, out, inp);
        let data = match dtype {
            WeightDtype::F32 => Panels::F32(data),
            WeightDtype::Bf16 => Panels::Bf16(data.into_iter().map(to_bf16).collect()),
            WeightDtype::F16 => Panels::F16(data.into_iter().map(f16::from_f32).collect()),
        };
        Self { data, out, inp }
    }

    /// Packs a row-major `[out][inp]` matrix of IEEE halves as they are
    /// (GGUF F16: no round trip through f32).
    pub fn pack_f16(w: &[f16], out: usize, inp: usize) -> Self {
        let data = Panels::F16(panelize(w, out, inp));
        Self { data, out, inp }
    }

    /// Packs a row-major `[out][inp]` matrix of bfloat16 bits as they are
    /// (GGUF BF16).
    pub fn pack_bf16(w: &[u16], out: usize, inp: usize) -> Self {
        let data = Panels::Bf16(panelize(w, out, inp));
        Self { data, out, inp }
    }

    /// How the weights are stored.
    pub fn dtype(&self) -> WeightDtype {
        match self.data {
            Panels::F32(_) => WeightDtype::F32,
            Panels::Bf16(_) => WeightDtype::Bf16,
            Panels::F16(_) => WeightDtype::F16,
        }
    }

    /// Bytes the weights occupy.
    pub fn size_bytes(&self) -> usize {
        match &self.data {
            Panels::F32(w) => w.len() * 4,
            Panels::Bf16(w) => w.len() * 2,
            Panels::F16(w) => w.len() * 2,
        }
    }

    /// The row-major `[out][inp]` matrix back (bf16/f16 widened to f32).
    pub fn unpack(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.out * self.inp];
        for (o, row) in w
            .chunks_exact_mut(self.inp.max(1))
            .enumerate()
            .take(self.out)
        {
            let panel = (o / LANES) * self.inp * LANES;
            for (k, v) in row.iter_mut().enumerate() {
                *v = self.data.get(panel + k * LANES + o % LANES);
            }
        }
        w
    }

    /// Output dimension.
    pub fn out_dim(&self) -> usize {
        self.out
    }

    /// Input dimension.
    pub fn in_dim(&self) -> usize {
        self.inp
    }

    /// `x` is `[rows][in]`; returns `x Wᵀ`, `[rows][out]`.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = Vec::new();
        self.matmul_into(x, rows, &mut y);
        y
    }

    /// [`PackedWeight::matmul`] into `y` (resized to `[rows][out]`), so that
    /// a step reuses its buffers.
    pub fn matmul_into(&self, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        self.product(Isa::detect(), x, rows, y);
    }

    /// [`PackedWeight::matmul_into`] with the plain register tiles whatever
    /// the rows (no blocked path, no one-row kernel): the benchmarks
    /// compare them.
    #[doc(hidden)]
    pub fn matmul_plain_into(&self, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        if shape_output(x, rows, (self.inp, self.out), y) {
            self.product_tiles(Isa::detect(), x, rows, y);
        }
    }

    /// The product with the kernels of `isa` (tests run each one the CPU has).
    fn product(&self, isa: Isa, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        // Every cell is written below: no need to clear what was there.
        if !shape_output(x, rows, (self.inp, self.out), y) {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if isa.kind() == IsaKind::Avx2 && rows >= BLOCKED_MIN_ROWS {
            return self.product_blocked(isa, x, rows, y);
        }
        #[cfg(target_arch = "x86_64")]
        if isa.kind() == IsaKind::Avx2 && rows == 1 {
            return self.product_row(x, y);
        }
        self.product_tiles(isa, x, rows, y);
    }

    /// The product with the plain register tiles (`y` already sized).
    fn product_tiles(&self, isa: Isa, x: &[f32], rows: usize, y: &mut [f32]) {
        let nv = isa.panels_per_tile(rows);
        let out = Out {
            ptr: y.as_mut_ptr(),
            rows,
            cols: self.out,
        };
        let tiles = Tiles { isa, nv };
        schedule(rows, self.inp, self.out, nv, |r, g| {
            self.compute(x, r, g, tiles, &out)
        });
    }

    /// Computes rows `rows` × the columns of panel groups `groups` (of
    /// `tiles.nv` panels): each group's panels stay in L1 while every row
    /// tile uses them.
    fn compute(
        &self,
        x: &[f32],
        rows: Range<usize>,
        groups: Range<usize>,
        tiles: Tiles,
        out: &Out,
    ) {
        let Tiles { isa, nv } = tiles;
        let panel_len = self.inp * LANES;
        let panels = self.out.div_ceil(LANES);
        for g in groups {
            let p0 = g * nv;
            let np = nv.min(panels - p0);
            let w = self.data.slice(p0 * panel_len..(p0 + np) * panel_len);
            for (r0, mr) in row_tiles(rows.clone()) {
                let t = Tile {
                    w,
                    x: &x[r0 * self.inp..(r0 + mr) * self.inp],
                    inp: self.inp,
                    row0: r0,
                    col0: p0 * LANES,
                };
                kernel(isa, mr, nv, &t, out);
            }
        }
    }
}

/// Panels the one-row kernel reads side by side: 8 independent accumulator
/// chains (2 per panel) hide the FMA latency, and 4 streams are few enough
/// for the hardware prefetcher.
#[cfg(target_arch = "x86_64")]
const ROW_PANELS: usize = 4;

/// Tasks per thread of a parallel one-row product: near-equal runs of
/// panel groups, so each thread streams long sequential runs, with a
/// second task each to rebalance when one thread is held up.
#[cfg(target_arch = "x86_64")]
const ROW_TASKS_PER_THREAD: usize = 2;

/// Bytes ahead of each panel stream that the one-row kernel prefetches
/// into L2 for 16-bit weights: their converts make 4× the instructions per
/// byte of f32's, so the out-of-order window alone keeps fewer lines in
/// flight (f32 needs no prefetch).
#[cfg(target_arch = "x86_64")]
const ROW_PREFETCH_BYTES: usize = 256;

#[cfg(target_arch = "x86_64")]
impl PackedWeight {
    /// The one-row product with AVX2 (decode at batch 1): groups of
    /// [`ROW_PANELS`] panels, split across the pool in near-equal runs.
    /// Each column's sum is the plain 1-row tile's, in the same order.
    fn product_row(&self, x: &[f32], y: &mut [f32]) {
        let out = Out {
            ptr: y.as_mut_ptr(),
            rows: 1,
            cols: self.out,
        };
        let panels = self.out.div_ceil(LANES);
        let groups = panels.div_ceil(ROW_PANELS);
        let panel_len = self.inp * LANES;
        let job = |gs: Range<usize>| {
            for g in gs {
                let p0 = g * ROW_PANELS;
                let np = ROW_PANELS.min(panels - p0);
                let w = self.data.slice(p0 * panel_len..(p0 + np) * panel_len);
                // SAFETY: the caller checked that the CPU runs AVX2 (with
                // FMA and F16C).
                let acc = unsafe {
                    match w {
                        PanelSlice::F32(w) => row_avx2::<ROW_PANELS, f32>(x, w, self.inp, np),
                        PanelSlice::F16(w) => row_avx2::<ROW_PANELS, f16>(x, w, self.inp, np),
                        PanelSlice::Bf16(w) => row_avx2::<ROW_PANELS, u16>(x, w, self.inp, np),
                    }
                };
                out.store_at::<1, ROW_PANELS>(0, p0 * LANES, np, &[acc]);
            }
        };
        if self.inp * self.out < PARALLEL_MIN_MACS {
            job(0..groups);
        } else {
            let tasks = (rayon::current_num_threads() * ROW_TASKS_PER_THREAD).min(groups);
            (0..tasks)
                .into_par_iter()
                .for_each(|t| job(t * groups / tasks..(t + 1) * groups / tasks));
        }
    }
}

/// One row of `x` (`inp` long) against `NV` panels of `w` of which `np`
/// are present (the missing ones are computed from the last one and not
/// stored): the 1-row tile of [`tile_avx2`], unrolled by 4 steps, with
/// 16-bit weights prefetched [`ROW_PREFETCH_BYTES`] ahead.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_avx2<const NV: usize, E: Elem>(
    x: &[f32],
    w: &[E],
    inp: usize,
    np: usize,
) -> [[f32; LANES]; NV] {
    use std::arch::x86_64::*;
    assert!((1..=NV).contains(&np) && x.len() >= inp && w.len() >= np * inp * LANES);
    let panel_len = inp * LANES;
    let base: [*const E; NV] = std::array::from_fn(|p| w[p.min(np - 1) * panel_len..].as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 2]; NV];
    let xp = x.as_ptr();
    let size = std::mem::size_of::<E>();
    // Lines one panel's 4 steps span (2 for 16-bit weights).
    let lines = (4 * LANES * size).div_ceil(64);
    macro_rules! step {
        ($k:expr) => {{
            let k = $k;
            // SAFETY: k < inp: inside `x` (checked above).
            let xv = unsafe { _mm256_broadcast_ss(&*xp.add(k)) };
            for (a, b) in acc.iter_mut().zip(&base) {
                // SAFETY: k < inp: the 16 weights lie inside the panel.
                unsafe {
                    let at = b.add(k * LANES);
                    a[0] = _mm256_fmadd_ps(load8(at), xv, a[0]);
                    a[1] = _mm256_fmadd_ps(load8(at.add(8)), xv, a[1]);
                }
            }
        }};
    }
    for k in (0..inp / 4).map(|j| j * 4) {
        if size == 2 {
            for b in &base {
                let at = b.wrapping_add(k * LANES).cast::<u8>();
                for l in 0..lines {
                    // Past the panel's end it fetches the next panel's
                    // start, or nothing: a prefetch never faults.
                    _mm_prefetch::<_MM_HINT_T1>(
                        at.wrapping_add(ROW_PREFETCH_BYTES + l * 64).cast(),
                    );
                }
            }
        }
        step!(k);
        step!(k + 1);
        step!(k + 2);
        step!(k + 3);
    }
    for k in inp / 4 * 4..inp {
        step!(k);
    }
    let mut res = [[0f32; LANES]; NV];
    for (dst, a) in res.iter_mut().zip(&acc) {
        // SAFETY: `dst` is LANES (16) floats: two 8-float stores.
        unsafe {
            _mm256_storeu_ps(dst.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(dst.as_mut_ptr().add(8), a[1]);
        }
    }
    res
}

/// `rows` cut into near-equal tiles of at most [`MAX_MR`], as `(first row,
/// rows)`, so that 32 rows are 6+6+5+5+5+5, all with the widest kernel.
fn row_tiles(rows: Range<usize>) -> impl Iterator<Item = (usize, usize)> {
    let n = rows.len();
    let count = n.div_ceil(MAX_MR);
    let (base, extra) = (n / count.max(1), n % count.max(1));
    (0..count).scan(rows.start, move |r0, i| {
        let mr = base + usize::from(i < extra);
        let tile = (*r0, mr);
        *r0 += mr;
        Some(tile)
    })
}

/// Checks that `x` is `[rows][inp]` and sizes `y` to `[rows][out]` (its
/// cells are all written by the caller); false when there is nothing to
/// compute.
pub(crate) fn shape_output(
    x: &[f32],
    rows: usize,
    (inp, out): (usize, usize),
    y: &mut Vec<f32>,
) -> bool {
    assert_eq!(x.len(), rows * inp, "input is not [{rows}][{inp}]");
    y.resize(rows * out, 0.0);
    rows > 0 && out > 0
}

/// The driver the quantized products share: checks that `x` is
/// `[rows][inp]`, sizes `y` to `[rows][out]`, and runs `compute(isa, nv,
/// rows, groups, out)` over [`schedule`]'s split. AVX-512 CPUs run the AVX2
/// quantized kernels (no AVX-512 one could be tested here).
pub(crate) fn quantized_product(
    isa: Isa,
    x: &[f32],
    rows: usize,
    (inp, out_dim): (usize, usize),
    y: &mut Vec<f32>,
    compute: impl Fn(Isa, usize, Range<usize>, Range<usize>, &Out) + Sync,
) {
    if !shape_output(x, rows, (inp, out_dim), y) {
        return;
    }
    let isa = match isa.kind() {
        IsaKind::Avx512 => Isa::get(IsaKind::Avx2).unwrap_or(isa),
        _ => isa,
    };
    let nv = isa.panels_per_tile(rows);
    let out = Out {
        ptr: y.as_mut_ptr(),
        rows,
        cols: out_dim,
    };
    schedule(rows, inp, out_dim, nv, |r, g| compute(isa, nv, r, g, &out));
}

/// Cuts a `[rows] x [inp] x [out]` product into blocks of [`ROW_BLOCK`]
/// rows × runs of panel groups (of `nv` panels) and runs `job` on each, on
/// this thread when the product is small, else across the rayon pool.
pub(crate) fn schedule(
    rows: usize,
    inp: usize,
    out: usize,
    nv: usize,
    job: impl Fn(Range<usize>, Range<usize>) + Sync,
) {
    schedule_blocks(rows, ROW_BLOCK, inp, out, nv, job);
}

/// [`schedule`] with blocks of `row_block` rows.
fn schedule_blocks(
    rows: usize,
    row_block: usize,
    inp: usize,
    out: usize,
    nv: usize,
    job: impl Fn(Range<usize>, Range<usize>) + Sync,
) {
    let groups = out.div_ceil(LANES).div_ceil(nv);
    let blocks = rows.div_ceil(row_block);
    let block = |b: usize| b * row_block..((b + 1) * row_block).min(rows);
    if rows * inp * out < PARALLEL_MIN_MACS {
        for b in 0..blocks {
            job(block(b), 0..groups);
        }
    } else {
        let group_macs = rows.min(row_block) * inp * nv * LANES;
        let per_task = (TASK_MACS / group_macs.max(1)).max(1);
        let chunks = groups.div_ceil(per_task);
        (0..blocks * chunks).into_par_iter().for_each(|i| {
            let g0 = (i % chunks) * per_task;
            job(block(i / chunks), g0..(g0 + per_task).min(groups));
        });
    }
}

/// How a product is cut into register tiles.
#[derive(Clone, Copy)]
struct Tiles {
    isa: Isa,
    /// Panels per tile.
    nv: usize,
}

/// Rows per block of work: a block's rows of `x` stay in cache while the
/// weights stream past, and large prefills split across threads by rows too.
pub(crate) const ROW_BLOCK: usize = 48;

impl Isa {
    /// Panels per tile for a product of `rows` rows: at least 8 independent
    /// accumulators to hide the FMA latency with few rows, and as many as the
    /// registers hold (next to the weights and the broadcast) with many.
    pub(crate) fn panels_per_tile(self, rows: usize) -> usize {
        match (self.kind(), rows) {
            (IsaKind::Avx512, 1) => 8,
            (IsaKind::Avx512, _) => 4,
            (_, 1) => 4,
            (_, 2 | 3) => 2,
            _ => 1,
        }
    }
}

/// The output, written by tiles that each own distinct (row, column) cells.
pub(crate) struct Out {
    pub(crate) ptr: *mut f32,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

// SAFETY: tasks write disjoint cells (distinct panel groups are distinct
// columns) of a buffer that outlives the parallel section.
unsafe impl Sync for Out {}

/// One register tile's operands.
struct Tile<'a> {
    /// The tile's panels, `[np][inp][LANES]`.
    w: PanelSlice<'a>,
    /// Its rows of `x`, `[mr][inp]`.
    x: &'a [f32],
    inp: usize,
    row0: usize,
    col0: usize,
}

impl Tile<'_> {
    /// Panels present (the last group of a matrix may have fewer than NV).
    fn panels(&self) -> usize {
        self.w.len() / (self.inp * LANES).max(1)
    }
}

/// A tile's result: `[MR][NV][LANES]`.
pub(crate) type Acc<const MR: usize, const NV: usize> = [[[f32; LANES]; NV]; MR];

impl Out {
    /// The address of cell (`row`, `col`), which must be inside (the
    /// caller owns the cells it writes through it).
    #[cfg(target_arch = "x86_64")]
    fn cell(&self, row: usize, col: usize) -> *mut f32 {
        assert!(row < self.rows && col < self.cols);
        // SAFETY: inside the buffer (asserted).
        unsafe { self.ptr.add(row * self.cols + col) }
    }

    /// Stores `acc` at the tile's place, dropping padding columns.
    fn store<const MR: usize, const NV: usize>(&self, t: &Tile<'_>, acc: &Acc<MR, NV>) {
        self.store_at(t.row0, t.col0, t.panels(), acc);
    }

    /// Stores the first `np` panels of `acc` at row `row0`, column `col0`
    /// (the caller owns those cells).
    pub(crate) fn store_at<const MR: usize, const NV: usize>(
        &self,
        row0: usize,
        col0: usize,
        np: usize,
        acc: &Acc<MR, NV>,
    ) {
        for (r, row) in acc.iter().enumerate() {
            let y = row0 + r;
            debug_assert!(y < self.rows);
            for (p, v) in row.iter().enumerate().take(np) {
                let c0 = col0 + p * LANES;
                let n = LANES.min(self.cols.saturating_sub(c0));
                // SAFETY: y < rows and c0 + n <= cols, so the cells are inside
                // the buffer; no other tile writes them (see `Out`).
                unsafe {
                    let dst = self.ptr.add(y * self.cols + c0);
                    if n == LANES {
                        // A fixed-size store, not a call to memcpy.
                        dst.cast::<[f32; LANES]>().write_unaligned(*v);
                    } else {
                        std::ptr::copy_nonoverlapping(v.as_ptr(), dst, n);
                    }
                }
            }
        }
    }
}

/// Runs the micro-kernel for `mr` rows and `nv` panels (the pairs
/// [`Isa::panels_per_tile`] and [`PackedWeight::compute`] produce).
// Every call is wrapped in `unsafe`, which the portable kernel does not need.
#[allow(unused_unsafe)]
fn kernel(isa: Isa, mr: usize, nv: usize, t: &Tile<'_>, out: &Out) {
    macro_rules! go {
        ($f:ident; $($m:literal x $n:literal),*) => {
            match (mr, nv, t.w) {
                $(
                    ($m, $n, PanelSlice::F32(w)) => {
                        // SAFETY: `isa` names the kernel family (see below).
                        let acc = unsafe { $f::<$m, $n, f32>(t, w) };
                        out.store::<$m, $n>(t, &acc)
                    }
                    ($m, $n, PanelSlice::Bf16(w)) => {
                        // SAFETY: `isa` names the kernel family (see below).
                        let acc = unsafe { $f::<$m, $n, u16>(t, w) };
                        out.store::<$m, $n>(t, &acc)
                    }
                    ($m, $n, PanelSlice::F16(w)) => {
                        // SAFETY: `isa` names the kernel family (see below).
                        let acc = unsafe { $f::<$m, $n, f16>(t, w) };
                        out.store::<$m, $n>(t, &acc)
                    }
                )*
                _ => unreachable!("no {mr}x{nv} kernel for {isa:?}"),
            }
        };
    }
    // SAFETY (the `unsafe` calls): an `Isa` can only be made by detection
    // (see `isa.rs`), so holding one means the CPU has its features.
    match isa.kind() {
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx512 => go!(tile_avx512; 1 x 8, 1 x 4, 2 x 4, 3 x 4, 4 x 4, 5 x 4, 6 x 4),
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 => go!(
            tile_avx2; 1 x 4, 2 x 2, 3 x 2, 1 x 1, 2 x 1, 3 x 1, 4 x 1, 5 x 1, 6 x 1
        ),
        _ => go!(tile_portable; 1 x 4, 2 x 2, 3 x 2, 1 x 1, 2 x 1, 3 x 1, 4 x 1, 5 x 1, 6 x 1),
    }
}

/// The tile's product, portable (the compiler vectorises what it can).
fn tile_portable<const MR: usize, const NV: usize, E: Elem>(t: &Tile<'_>, w: &[E]) -> Acc<MR, NV> {
    let mut acc = [[[0f32; LANES]; NV]; MR];
    let panel_len = t.inp * LANES;
    let np = t.panels().min(NV);
    for k in 0..t.inp {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let xv = t.x[r * t.inp + k];
            for (p, a) in acc_r.iter_mut().enumerate().take(np) {
                let w = &w[p * panel_len + k * LANES..][..LANES];
                for l in 0..LANES {
                    a[l] += w[l].widen() * xv;
                }
            }
        }
    }
    acc
}

/// Checks the bounds the unchecked kernels rely on; returns the panels present.
#[cfg(target_arch = "x86_64")]
fn checked_panels<const MR: usize, const NV: usize>(t: &Tile<'_>) -> usize {
    let np = t.panels().min(NV);
    assert!(t.x.len() >= MR * t.inp && t.w.len() >= np * t.inp * LANES);
    np
}

/// Loads 8 weights as f32 (bf16: widened by shifting into the high half;
/// f16: converted by F16C, which [`IsaKind::Avx2`] includes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<E: Elem>(p: *const E) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: the caller passes 8 readable elements.
    unsafe {
        match E::WIDEN {
            Widen::Bf16 => {
                let h = _mm_loadu_si128(p.cast::<__m128i>());
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
            Widen::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())),
            Widen::None => _mm256_loadu_ps(p.cast::<f32>()),
        }
    }
}

/// Loads 16 weights as f32 (bf16: widened by shifting into the high half;
/// f16: `vcvtph2ps`, part of AVX-512F).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16<E: Elem>(p: *const E) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: the caller passes 16 readable elements.
    unsafe {
        match E::WIDEN {
            Widen::Bf16 => {
                let h = _mm256_loadu_si256(p.cast::<__m256i>());
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
            Widen::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast::<__m256i>())),
            Widen::None => _mm512_loadu_ps(p.cast::<f32>()),
        }
    }
}

/// The tile's product with AVX2/FMA: `MR × 2·NV` accumulators in registers.
/// A missing last panel is computed from zeros and not stored.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_avx2<const MR: usize, const NV: usize, E: Elem>(t: &Tile<'_>, w: &[E]) -> Acc<MR, NV> {
    use std::arch::x86_64::*;
    let np = checked_panels::<MR, NV>(t);
    let panel_len = t.inp * LANES;
    let mut acc = [[[_mm256_setzero_ps(); 2]; NV]; MR];
    let (w, x) = (w.as_ptr(), t.x.as_ptr());
    for k in 0..t.inp {
        let mut wv = [[_mm256_setzero_ps(); 2]; NV];
        for (p, v) in wv.iter_mut().enumerate().take(np) {
            // SAFETY: p < np and k < inp, so the 16 weights lie inside `w`
            // (checked above).
            unsafe {
                let at = w.add(p * panel_len + k * LANES);
                *v = [load8(at), load8(at.add(8))];
            }
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: r < MR and k < inp: inside `t.x` (checked above).
            let xv = unsafe { _mm256_broadcast_ss(&*x.add(r * t.inp + k)) };
            for (a, v) in acc_r.iter_mut().zip(&wv) {
                a[0] = _mm256_fmadd_ps(v[0], xv, a[0]);
                a[1] = _mm256_fmadd_ps(v[1], xv, a[1]);
            }
        }
    }
    let mut res = [[[0f32; LANES]; NV]; MR];
    for (dst_r, acc_r) in res.iter_mut().zip(&acc) {
        for (dst, a) in dst_r.iter_mut().zip(acc_r) {
            // SAFETY: `dst` is LANES (16) floats: two 8-float stores.
            unsafe {
                _mm256_storeu_ps(dst.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(dst.as_mut_ptr().add(8), a[1]);
            }
        }
    }
    res
}

/// The tile's product with AVX-512: `MR × NV` accumulators in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn tile_avx512<const MR: usize, const NV: usize, E: Elem>(t: &Tile<'_>, w: &[E]) -> Acc<MR, NV> {
    use std::arch::x86_64::*;
    let np = checked_panels::<MR, NV>(t);
    let panel_len = t.inp * LANES;
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    let (w, x) = (w.as_ptr(), t.x.as_ptr());
    for k in 0..t.inp {
        let mut wv = [_mm512_setzero_ps(); NV];
        for (p, v) in wv.iter_mut().enumerate().take(np) {
            // SAFETY: p < np and k < inp, so the 16 weights lie inside `w`
            // (checked above).
            *v = unsafe { load16(w.add(p * panel_len + k * LANES)) };
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: r < MR and k < inp: inside `t.x` (checked above).
            let xv = _mm512_set1_ps(unsafe { *x.add(r * t.inp + k) });
            for (a, &v) in acc_r.iter_mut().zip(&wv) {
                *a = _mm512_fmadd_ps(v, xv, *a);
            }
        }
    }
    let mut res = [[[0f32; LANES]; NV]; MR];
    for (dst_r, acc_r) in res.iter_mut().zip(&acc) {
        for (dst, a) in dst_r.iter_mut().zip(acc_r) {
            // SAFETY: `dst` is LANES (16) floats.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), *a) };
        }
    }
    res
}

/// Rows from which AVX2 products take the blocked path: from 8 rows (a
/// decode step at concurrency 8) the plain tiles' two row tiles read each
/// panel twice, the second time from L2, while the blocked path keeps a
/// KC slice in L1 for both; a whole 8-row step of the side-by-side model
/// took about 0.7× the time (docs/results/cpu-executor.md, "decode at 8 rows").
pub(crate) const BLOCKED_MIN_ROWS: usize = 8;

/// Most row tiles of a row block whose 16-bit weights the blocked path
/// widens in the kernel's registers, each tile again, instead of once per
/// slice into a scratch f32 slice that every tile reads back: with few
/// tiles (a decode step at concurrency 8 has 2) the separate widening pass
/// costs more than the conversions it saves: a whole 8-row step of the
/// side-by-side model's F16 and BF16 files took 0.75–0.80× the time, 16
/// rows (3 tiles) the same, 24 rows 1.15× (docs/results/cpu-executor.md).
const DIRECT_16BIT_MAX_TILES: usize = 2;

/// Inner-dimension block of the blocked path: a panel's `KC × LANES` f32
/// weights (16 KiB) stay in L1 while every row tile of the block uses them.
const KC: usize = 256;

/// Most rows of a row block of the blocked path: their packed `x` over one
/// [`KC`] block (rows × KC f32, 256 KiB at 256 rows) stays in L2 while every
/// panel of a task passes over it.
const BLOCKED_ROW_BLOCK: usize = 256;

/// Panels a task of the blocked path computes (64 columns): each of its KC
/// blocks of `x` is read from L2 once per panel, and a 128-row product of
/// `o` (48 panels) still makes 12 tasks to balance two threads.
const BLOCKED_TASK_PANELS: usize = 4;

thread_local! {
    /// The blocked path's per-thread scratch: the packed `x` of a product,
    /// and a task's widened weights and accumulators.
    static X_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    static TASK_SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<[f32; LANES]>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` on a thread-local buffer, or on a fresh one when the thread's is
/// in use (a rayon worker that took up a task of another product).
fn with_scratch<T: Default, R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut T::default()),
    })
}

/// Rows per block of the blocked path: at most [`BLOCKED_ROW_BLOCK`], in
/// near-equal blocks.
fn blocked_row_block(rows: usize) -> usize {
    rows.div_ceil(rows.div_ceil(BLOCKED_ROW_BLOCK))
}

/// `x`'s rows packed per register tile, `[k][mr]` (the tiles of
/// [`row_tiles`] over each block of `row_block` rows), so that the kernel
/// broadcasts from one sequential stream at fixed offsets.
fn pack_rows(x: &[f32], rows: usize, inp: usize, row_block: usize, xp: &mut Vec<f32>) {
    // Grown, not cleared: every cell is written below.
    if xp.len() < rows * inp {
        xp.resize(rows * inp, 0.0);
    }
    for b0 in (0..rows).step_by(row_block) {
        for (r0, mr) in row_tiles(b0..(b0 + row_block).min(rows)) {
            let dst = &mut xp[r0 * inp..(r0 + mr) * inp];
            let src = &x[r0 * inp..(r0 + mr) * inp];
            // Sequential writes, `mr` sequential reads.
            for (k, d) in dst.chunks_exact_mut(mr).enumerate() {
                for (r, v) in d.iter_mut().enumerate() {
                    *v = src[r * inp + k];
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl PackedWeight {
    /// The product for many rows with AVX2 (prefill): `x` packed per row
    /// tile once; tasks of [`BLOCKED_TASK_PANELS`] panels × a row block;
    /// within a task the inner dimension is cut into [`KC`] blocks, and for
    /// each block every panel's slice stays in L1 (f16/bf16 widened to f32
    /// once per slice, not per row tile, unless the block has at most
    /// [`DIRECT_16BIT_MAX_TILES`] row tiles) while every row tile passes over
    /// it, the block's packed `x` staying in L2 for all the task's panels;
    /// 6×16 tiles whose accumulators carry from block to block in f32 (the
    /// same sums, in the same order, as the plain tiles).
    fn product_blocked(&self, isa: Isa, x: &[f32], rows: usize, y: &mut [f32]) {
        let inp = self.inp;
        let row_block = blocked_row_block(rows);
        let out = Out {
            ptr: y.as_mut_ptr(),
            rows,
            cols: self.out,
        };
        with_scratch(&X_SCRATCH, |xp| {
            pack_rows(x, rows, inp, row_block, xp);
            let xp = &xp[..];
            schedule_blocks(
                rows,
                row_block,
                inp,
                self.out,
                BLOCKED_TASK_PANELS,
                |r, g| {
                    with_scratch(&TASK_SCRATCH, |(wide, acc)| {
                        self.compute_blocked(isa, xp, r, g, (wide, acc), &out)
                    })
                },
            );
        });
    }

    /// Rows `rows` × panel groups `groups` (of [`BLOCKED_TASK_PANELS`]) of
    /// the blocked path.
    fn compute_blocked(
        &self,
        _isa: Isa,
        xp: &[f32],
        rows: Range<usize>,
        groups: Range<usize>,
        (wide, acc): (&mut Vec<f32>, &mut Vec<[f32; LANES]>),
        out: &Out,
    ) {
        let inp = self.inp;
        let panel_len = inp * LANES;
        let all = self.out.div_ceil(LANES);
        let panels =
            groups.start * BLOCKED_TASK_PANELS..(groups.end * BLOCKED_TASK_PANELS).min(all);
        let n = rows.len();
        // Grown, not cleared: the first block writes every cell before a
        // block reads it.
        if acc.len() < n * panels.len() {
            acc.resize(n * panels.len(), [0.0; LANES]);
        }
        wide.resize(KC * LANES, 0.0);
        let few_tiles = rows.len().div_ceil(MAX_MR) <= DIRECT_16BIT_MAX_TILES;
        for k0 in (0..inp).step_by(KC) {
            let kc = KC.min(inp - k0);
            for (i, p) in panels.clone().enumerate() {
                let span = p * panel_len + k0 * LANES..p * panel_len + (k0 + kc) * LANES;
                // The next slice this task reads (the next panel's, or the
                // first panel's of the next block) does not follow this one
                // in memory, so the first tiles prefetch it into L2 by hand.
                let next = if p + 1 < panels.end {
                    Some(((p + 1) * panel_len + k0 * LANES, kc))
                } else if k0 + KC < inp {
                    Some((
                        panels.start * panel_len + (k0 + KC) * LANES,
                        KC.min(inp - k0 - KC),
                    ))
                } else {
                    None
                };
                let (pf, pf_bytes) = next.map_or((std::ptr::null(), 0), |(at, len)| {
                    self.data.bytes_at(at, len * LANES)
                });
                let acc = &mut acc[i * n..(i + 1) * n];
                // The last block of a whole panel stores its sums in `y`
                // itself; the others (and a last, partial panel) in `acc`.
                let direct = k0 + kc == inp && (p + 1) * LANES <= self.out;
                // Every row tile over the slice `w` (f32, or 16-bit
                // widened in the kernel's registers).
                macro_rules! tiles {
                    ($w:expr) => {{
                        let w = $w;
                        for (t, (r0, mr)) in row_tiles(rows.clone()).enumerate() {
                            let a = &mut acc[r0 - rows.start..][..mr];
                            let dst = if direct {
                                out.cell(r0, p * LANES)
                            } else {
                                std::ptr::null_mut()
                            };
                            let xt = &xp[r0 * inp + k0 * mr..][..kc * mr];
                            // Tile t prefetches the next slice's bytes from
                            // t·PREFETCH_BYTES (prefetching does not fault: a
                            // pointer past the slice is only never used).
                            let from = (t * PREFETCH_BYTES).min(pf_bytes);
                            let part =
                                (pf.wrapping_add(from), (pf_bytes - from).min(PREFETCH_BYTES));
                            // SAFETY: `_isa` is AVX2 (the caller checked), so
                            // the CPU has AVX2, FMA and F16C; `dst`, when not
                            // null, is row r0's column p·LANES of `y`, which
                            // has rows r0..r0 + mr and columns p·LANES.. +
                            // LANES (a whole panel), cells this task alone
                            // writes (see `Out`).
                            unsafe {
                                block_tile_avx2(mr, xt, w, kc, a, k0 == 0, part, (dst, out.cols))
                            };
                        }
                    }};
                }
                match self.data.slice(span) {
                    PanelSlice::F32(w) => tiles!(w),
                    PanelSlice::F16(w) if few_tiles => tiles!(w),
                    PanelSlice::Bf16(w) if few_tiles => tiles!(w),
                    // SAFETY: as above, the CPU has F16C.
                    PanelSlice::F16(w) => tiles!(unsafe { widen_avx2(w, wide) }),
                    // SAFETY: as above.
                    PanelSlice::Bf16(w) => tiles!(unsafe { widen_avx2(w, wide) }),
                }
            }
        }
        for (i, p) in panels.enumerate() {
            if (p + 1) * LANES > self.out {
                for (r, a) in acc[i * n..(i + 1) * n].iter().enumerate() {
                    out.store_at::<1, 1>(rows.start + r, p * LANES, 1, &[[*a]]);
                }
            }
        }
    }
}

/// Bytes of the next weight slice each row tile prefetches (64 lines: one
/// per 4 steps of a 256-long block): a 16 KiB f32 slice is fetched by the
/// first 4 tiles of a block's 22 (at 128 rows).
const PREFETCH_BYTES: usize = 4096;

#[cfg(target_arch = "x86_64")]
impl Panels {
    /// The address of element `at` and the bytes of `len` elements from it
    /// (for prefetching; never read through).
    fn bytes_at(&self, at: usize, len: usize) -> (*const u8, usize) {
        match self {
            Self::F32(w) => (w[at..].as_ptr().cast(), len * 4),
            Self::Bf16(w) => (w[at..].as_ptr().cast(), len * 2),
            Self::F16(w) => (w[at..].as_ptr().cast(), len * 2),
        }
    }
}

/// `src` widened to f32 into `dst` (resized to fit); returns it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen_avx2<'a, E: Elem>(src: &[E], dst: &'a mut Vec<f32>) -> &'a [f32] {
    dst.resize(src.len(), 0.0);
    let chunks = src.len() / 8;
    for i in 0..chunks {
        // SAFETY: 8 elements from 8·i are inside both slices.
        unsafe {
            let v = load8(src.as_ptr().add(i * 8));
            std::arch::x86_64::_mm256_storeu_ps(dst.as_mut_ptr().add(i * 8), v);
        }
    }
    for i in chunks * 8..src.len() {
        dst[i] = src[i].widen();
    }
    &dst[..src.len()]
}

/// Runs [`block_avx2`] for a tile of `mr` (1 to [`MAX_MR`]) rows.
///
/// # Safety
/// As [`block_avx2`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_tile_avx2<E: Elem>(
    mr: usize,
    xt: &[f32],
    w: &[E],
    kc: usize,
    acc: &mut [[f32; LANES]],
    first: bool,
    pf: (*const u8, usize),
    dst: (*mut f32, usize),
) {
    // SAFETY: the caller's.
    unsafe {
        match mr {
            1 => block_avx2::<1, E>(xt, w, kc, acc, first, pf, dst),
            2 => block_avx2::<2, E>(xt, w, kc, acc, first, pf, dst),
            3 => block_avx2::<3, E>(xt, w, kc, acc, first, pf, dst),
            4 => block_avx2::<4, E>(xt, w, kc, acc, first, pf, dst),
            5 => block_avx2::<5, E>(xt, w, kc, acc, first, pf, dst),
            6 => block_avx2::<6, E>(xt, w, kc, acc, first, pf, dst),
            _ => unreachable!("no {mr}-row block kernel"),
        }
    }
}

/// One `kc`-long block of an `MR`-row tile against one panel: `acc` (the
/// tile's rows × LANES columns) starts from zero when `first`, else from
/// what the blocks before left, and receives the sums. `xt` is the tile's
/// packed `x` for the block, `[kc][MR]`; `w` the panel's, `[kc][LANES]`
/// (f32, or 16-bit widened as loaded).
/// The sums go to `dst` (pointer, row stride in floats) when it is not
/// null, else to `acc`. Every 4 steps it prefetches one line of `pf`
/// (address, bytes) into L2. The loop is unrolled by 4: the 2·MR
/// accumulators, the two weight vectors and the broadcast stay in registers.
///
/// # Safety
/// The CPU has AVX2 and FMA; a non-null `dst` is valid for writes of
/// LANES floats at each of `dst + r·stride`, r < MR, that nothing else
/// accesses meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_avx2<const MR: usize, E: Elem>(
    xt: &[f32],
    w: &[E],
    kc: usize,
    acc: &mut [[f32; LANES]],
    first: bool,
    (pf, pf_bytes): (*const u8, usize),
    (dst, stride): (*mut f32, usize),
) {
    use std::arch::x86_64::*;
    assert!(xt.len() >= kc * MR && w.len() >= kc * LANES && acc.len() >= MR);
    let mut a = [[_mm256_setzero_ps(); 2]; MR];
    if !first {
        for (v, row) in a.iter_mut().zip(acc.iter()) {
            // SAFETY: `row` is LANES (16) floats.
            unsafe {
                *v = [
                    _mm256_loadu_ps(row.as_ptr()),
                    _mm256_loadu_ps(row.as_ptr().add(8)),
                ];
            }
        }
    }
    let (mut x, mut w) = (xt.as_ptr(), w.as_ptr());
    // One step k: the panel's 16 weights times each row's x[k].
    macro_rules! step {
        ($s:literal) => {{
            let w0 = load8(w.add($s * LANES));
            let w1 = load8(w.add($s * LANES + 8));
            for (r, v) in a.iter_mut().enumerate() {
                let xv = _mm256_broadcast_ss(&*x.add($s * MR + r));
                v[0] = _mm256_fmadd_ps(w0, xv, v[0]);
                v[1] = _mm256_fmadd_ps(w1, xv, v[1]);
            }
        }};
    }
    let lines = pf_bytes.div_ceil(64);
    for j in 0..kc / 4 {
        // SAFETY: steps 4j..4j+4 < kc: MR floats of x and LANES of w each
        // (checked above); a prefetch reads nothing.
        unsafe {
            if j < lines {
                _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(j * 64).cast());
            }
            step!(0);
            step!(1);
            step!(2);
            step!(3);
            x = x.add(4 * MR);
            w = w.add(4 * LANES);
        }
    }
    for _ in 0..kc % 4 {
        // SAFETY: as above, one step.
        unsafe {
            step!(0);
            x = x.add(MR);
            w = w.add(LANES);
        }
    }
    let (dst, stride) = if dst.is_null() {
        (acc.as_mut_ptr().cast::<f32>(), LANES)
    } else {
        (dst, stride)
    };
    for (r, v) in a.iter().enumerate() {
        // SAFETY: `acc` holds MR rows of LANES floats (checked above); a
        // non-null `dst` is the caller's promise.
        unsafe {
            _mm256_storeu_ps(dst.add(r * stride), v[0]);
            _mm256_storeu_ps(dst.add(r * stride + 8), v[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], w: &[f32], rows: usize, inp: usize, out: usize) -> Vec<f32> {
        let mut y = vec![0f32; rows * out];
        for r in 0..rows {
            for o in 0..out {
                y[r * out + o] = (0..inp).map(|k| x[r * inp + k] * w[o * inp + k]).sum();
            }
        }
        y
    }

    fn check(rows: usize, inp: usize, out: usize) {
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 7) % 13) as f32 - 6.0)
            .collect();
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
            .collect();
        for dtype in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16] {
            // What the packed weight holds: bf16 and f16 round each value.
            let held: Vec<f32> = match dtype {
                WeightDtype::F32 => w.clone(),
                WeightDtype::Bf16 => w.iter().map(|&v| to_bf16(v).widen()).collect(),
                WeightDtype::F16 => w.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
            };
            let p = PackedWeight::pack_as(&w, out, inp, dtype);
            assert_eq!(p.dtype(), dtype);
            assert_eq!(p.unpack(), held, "pack/unpack round trip");
            let e = naive(&x, &held, rows, inp, out);
            for isa in crate::kernel_reference::isas_checked(module_path!()) {
                let mut y = vec![f32::NAN; 3];
                p.product(isa, &x, rows, &mut y);
                assert_eq!(y.len(), e.len());
                for (i, (a, b)) in y.iter().zip(&e).enumerate() {
                    assert!(
                        (a - b).abs() < 1e-3,
                        "{isa:?} {dtype:?} [{rows}x{inp}x{out}] {i}: {a} vs {b}"
                    );
                }
            }
            assert_eq!(p.matmul(&x, rows).len(), e.len());
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        assert_eq!(to_bf16(-2.0), 0xc000);
        // 1 + 2⁻⁸ is halfway between 1 and the next bf16: ties go to even (1).
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2⁻⁸ is halfway to an odd neighbour: rounds up to even.
        assert_eq!(to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(to_bf16(f32::INFINITY), 0x7f80);
        assert!(to_bf16(f32::NAN).widen().is_nan());
        // Rounding the largest finite f32 overflows to infinity, as it should.
        assert_eq!(to_bf16(f32::MAX), 0x7f80);
        let p = PackedWeight::pack_as(&[0.1; 64], 4, 16, WeightDtype::Bf16);
        assert_eq!(
            p.size_bytes(),
            16 * 16 * 2,
            "one panel of 16 rows, 2 bytes each"
        );
    }

    #[test]
    fn f16_weights_are_kept_and_widened_exactly() {
        // Halves across the range (subnormal, fractional, near the largest
        // finite), from bits as a GGUF F16 tensor holds them: unpacked and
        // multiplied, each is its exact f32 value, on every ISA, for every
        // row count a tile handles, serial and parallel.
        let bits = [
            0x0001u16, 0x3555, 0xb4cd, 0x7bff, 0xfbfe, 0x0400, 0x3c00, 0xc2d3, 0x1234,
        ];
        for (rows, inp, out) in [
            (1, 37, 61),
            (7, 9, 200),
            (13, 37, 61),
            (14, 8, 33),
            (3, 600, 700),
        ] {
            let w: Vec<f16> = (0..out * inp)
                .map(|i| f16::from_bits(bits[(i * 7) % bits.len()]))
                .collect();
            let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
            assert_eq!(wf[0], 5.960_464_5e-8, "the smallest subnormal half");
            let p = PackedWeight::pack_f16(&w, out, inp);
            assert_eq!(p.dtype(), WeightDtype::F16);
            assert_eq!(p.size_bytes(), out.div_ceil(LANES) * LANES * inp * 2);
            assert_eq!(p.unpack(), wf, "the halves, widened exactly");
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| ((i * 3) % 7) as f32 * 0.25 - 0.75)
                .collect();
            let e = naive(&x, &wf, rows, inp, out);
            let scale = e.iter().fold(1f32, |m, v| m.max(v.abs()));
            for isa in crate::kernel_reference::isas_checked(module_path!()) {
                let mut y = Vec::new();
                p.product(isa, &x, rows, &mut y);
                for (i, (a, b)) in y.iter().zip(&e).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * scale,
                        "{isa:?} [{rows}x{inp}x{out}] {i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn matches_naive_product_for_every_tile_shape() {
        // Every row count up to several tiles, out not a multiple of the
        // panel width or of a panel group, inp odd.
        for rows in 1..=14 {
            check(rows, 37, 61);
            check(rows, 9, 200);
        }
        check(32, 64, 96);
        check(33, 100, 77);
        check(1, 5, 3);
    }

    #[test]
    fn matches_naive_product_in_parallel() {
        // Above the threshold: split across tasks; also with more than one
        // panel group per task and a ragged last task.
        check(2, 600, 1000);
        check(32, 256, 517);
        check(200, 64, 130);
    }

    /// `x` (`rows` × `inp`) times `w` (`out` × `inp`) through `product`
    /// (the path under test: blocked or one-row, by `rows`) against the
    /// plain tiles, bit for bit (the same f32 sums in the same order), and
    /// against the naive product, for f32, f16 and bf16 weights.
    fn assert_plain_tiles_sums(isa: Isa, rows: usize, inp: usize, out: usize) {
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 7) % 13) as f32 * 0.37 - 2.1)
            .collect();
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 5) % 11) as f32 * 0.13 - 0.6)
            .collect();
        for dtype in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16] {
            let p = PackedWeight::pack_as(&w, out, inp, dtype);
            let e = naive(&x, &p.unpack(), rows, inp, out);
            let mut fast = vec![f32::NAN; 5];
            p.product(isa, &x, rows, &mut fast);
            let mut plain = vec![f32::NAN; rows * out];
            p.product_tiles(isa, &x, rows, &mut plain);
            assert_eq!(fast.len(), rows * out);
            for (i, ((a, b), c)) in fast.iter().zip(&plain).zip(&e).enumerate() {
                let at = format!("{dtype:?} [{rows}x{inp}x{out}] {i}");
                assert_eq!(a.to_bits(), b.to_bits(), "{at}: {a} vs plain {b}");
                assert!((a - c).abs() <= 1e-4 * c.abs().max(1.0), "{at}: {a} vs {c}");
            }
        }
    }

    #[test]
    fn blocked_path_gives_the_plain_tiles_sums() {
        // The AVX2 prefill path against the plain tiles, bit for bit (the
        // same f32 sums in the same order), and against the naive product:
        // rows from the threshold up (16-bit weights widened in registers up
        // to 12 rows, two row tiles, and through the scratch from 13), in
        // one row block and in several
        // (280 rows are two blocks of 140, tiled unlike one of 280), inp
        // shorter than a KC block and not a multiple of it, out not a
        // multiple of a panel nor of a task's panels (200 columns: 13
        // panels, tasks of 4, 4, 4, 1); serial (small) and parallel; f32,
        // f16 and bf16 weights.
        let Some(isa) = Isa::get(IsaKind::Avx2) else {
            return;
        };
        for (rows, inp, out) in [
            (BLOCKED_MIN_ROWS, 37, 61),
            (12, 530, 45),
            (13, 530, 45),
            (17, 300, 33),
            (23, 513, 100),
            (128, 768, 200),
            (130, 2100, 40),
            (45, 256, 16),
            (280, 530, 70),
        ] {
            assert_plain_tiles_sums(isa, rows, inp, out);
        }
    }

    #[test]
    fn one_row_path_gives_the_plain_tiles_sums() {
        // The AVX2 one-row (decode) kernel against the plain 1-row tile, bit
        // for bit (each column's sum in the same order), and against the
        // naive product: inp not a multiple of the 4-step unroll, out not a
        // multiple of a panel nor of a group (a ragged last group), serial
        // and parallel (past PARALLEL_MIN_MACS, more groups than tasks);
        // f32, f16 and bf16 weights.
        let Some(isa) = Isa::get(IsaKind::Avx2) else {
            return;
        };
        for (inp, out) in [
            (37, 61),
            (3, 20),
            (768, 40),
            (770, 1000),
            (2049, 300),
            (64, 16),
        ] {
            assert_plain_tiles_sums(isa, 1, inp, out);
        }
    }

    #[test]
    fn empty_shapes() {
        let p = PackedWeight::pack(&[], 0, 4);
        assert!(p.matmul(&[1.0; 8], 2).is_empty());
        let p = PackedWeight::pack(&[1.0; 8], 2, 4);
        assert!(p.matmul(&[], 0).is_empty());
    }
}

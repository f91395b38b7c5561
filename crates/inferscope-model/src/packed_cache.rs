//! The packed-weights cache: the panels a GGUF file's weights were repacked
//! into, saved in a cache directory by the first start and mapped in place
//! by the next ones, so a restart reads the panels from the page cache
//! instead of repacking them.
//!
//! One file per model file (named after its path), replaced when it no
//! longer matches: it names the GGUF file's path, size and modification
//! time, and the size and modification time of the `inferscope` executable
//! that wrote it (the panel layout belongs to the build). Inside, the
//! weights come in the order the loader repacks them, each with its
//! tensors' names and shape; a weight whose entry does not match what the
//! loader asks for is repacked instead (and the file rewritten). Dense
//! (F32, F16, BF16), K-quant (Q4_K, Q5_K, Q6_K, IQ4_XS) and Q8_0 (also
//! IQ4_NL) weights are saved; candle's other quantized types (Q4_0, Q5_0,
//! Q2_K, Q3_K, ...) are repacked at every start.
//!
//! A file is only ever replaced whole (written beside it, then renamed), so
//! a server mapping the old one keeps reading it unchanged. As with the
//! GGUF file's own map, truncating a file in use from outside would make
//! reads of the lost pages fault.
//!
//! Layout: 8 bytes of magic, the index's length (u64, little-endian), the
//! index (JSON), zeros up to a page boundary, then the arrays, each at a
//! 64-byte boundary; the index's ranges count from the page boundary.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, UNIX_EPOCH};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;
use crate::llama::{Linear, Packed};
use crate::packed::{PackedWeight, WeightDtype};
use crate::packed_kquant::{KQuant, PackedKQuant};
use crate::packed_q8::PackedQ8;

const MAGIC: &[u8; 8] = b"ISPANEL1";
/// Where the arrays start: the index is padded to this boundary.
const DATA_ALIGN: usize = 4096;
/// Each array's alignment within the data.
const ARRAY_ALIGN: usize = 64;
/// An index longer than this is a damaged file (a model with thousands of
/// experts' weights takes a few MiB).
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// Where the cache lives and how a new file is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedCache {
    /// The directory of cache files (created when missing).
    pub dir: PathBuf,
    /// Write a new file on a background thread (a server: serving starts
    /// at once) or before the load returns (tests, tools).
    pub background: bool,
}

/// What makes a cache file valid for a model file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Identity {
    source: String,
    source_bytes: u64,
    source_modified_ns: u128,
    build_bytes: u64,
    build_modified_ns: u128,
}

#[derive(Debug, Serialize, Deserialize)]
struct Index {
    identity: Identity,
    entries: Vec<Entry>,
}

/// What a cache file holds for the weight the loader asks for next.
enum Next {
    /// Its arrays, in place.
    Mapped(Packed),
    /// An entry of a type the cache does not save: repacked.
    Unsaved,
    /// No entry, or one for another weight: repacked.
    Mismatch,
}

/// One weight, in load order.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    /// The tensors it was repacked from, `+`-joined.
    name: String,
    /// `q4_k`, `q5_k`, `q6_k`, `iq4_xs`, `q8_0`, `f32`, `bf16`, `f16`;
    /// `None`: not saved.
    kind: Option<String>,
    out: usize,
    inp: usize,
    /// Byte ranges of its arrays, from the start of the data.
    arrays: Vec<(usize, usize)>,
}

/// How a saved weight is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    KQuant(KQuant),
    Q8,
    Dense(WeightDtype),
}

/// Each kind's name in an entry: one table for writing and reading.
const KINDS: [(&str, Kind); 8] = [
    ("q4_k", Kind::KQuant(KQuant::Q4K)),
    ("q5_k", Kind::KQuant(KQuant::Q5K)),
    ("q6_k", Kind::KQuant(KQuant::Q6K)),
    ("iq4_xs", Kind::KQuant(KQuant::Iq4Xs)),
    ("q8_0", Kind::Q8),
    ("f32", Kind::Dense(WeightDtype::F32)),
    ("bf16", Kind::Dense(WeightDtype::Bf16)),
    ("f16", Kind::Dense(WeightDtype::F16)),
];

fn kind_name(kind: Kind) -> &'static str {
    KINDS
        .iter()
        .find(|(_, k)| *k == kind)
        .map(|(n, _)| *n)
        .expect("every kind is in the table")
}

fn kind_named(name: &str) -> Option<Kind> {
    KINDS.iter().find(|(n, _)| *n == name).map(|(_, k)| *k)
}

fn modified_ns(meta: &std::fs::Metadata) -> u128 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

impl Identity {
    /// The identity of `source` as this build would save it; `None` when
    /// the file or the executable cannot be looked at.
    fn of(source: &Path) -> Option<Self> {
        let source = source.canonicalize().ok()?;
        let meta = std::fs::metadata(&source).ok()?;
        let exe = std::fs::metadata(std::env::current_exe().ok()?).ok()?;
        Some(Self {
            source: source.to_string_lossy().into_owned(),
            source_bytes: meta.len(),
            source_modified_ns: modified_ns(&meta),
            build_bytes: exe.len(),
            build_modified_ns: modified_ns(&exe),
        })
    }
}

impl PackedCache {
    /// The default directory: `$INFERSCOPE_CACHE_DIR/packed`, else
    /// `$XDG_CACHE_HOME/inferscope/packed`, else `~/.cache/inferscope/packed`.
    pub fn default_dir() -> Option<PathBuf> {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        if let Some(d) = env("INFERSCOPE_CACHE_DIR") {
            return Some(PathBuf::from(d).join("packed"));
        }
        let base = env("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("inferscope").join("packed"))
    }

    /// The cache file of the model file `source` (canonical path).
    fn file_for(&self, source: &str) -> PathBuf {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        source.hash(&mut h);
        let stem = Path::new(source)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.dir.join(format!("{stem}-{:016x}.panels", h.finish()))
    }
}

/// The weights of one load: those read back from a cache file (in order),
/// and every weight the load made, to save when the file was missing or
/// did not match.
pub(crate) struct CacheSession {
    cache: PackedCache,
    identity: Identity,
    file: PathBuf,
    map: Option<Arc<Mmap>>,
    pending: VecDeque<Entry>,
    /// Whether an entry did not match (or there was no valid file).
    stale: bool,
    made: Vec<(String, Option<Packed>)>,
}

impl CacheSession {
    /// A session for loading `source`; `None` when its identity cannot be
    /// taken (the cache is then not used).
    pub(crate) fn open(cache: &PackedCache, source: &Path) -> Option<Self> {
        let identity = Identity::of(source)?;
        let file = cache.file_for(&identity.source);
        let mut s = Self {
            cache: cache.clone(),
            identity,
            file,
            map: None,
            pending: VecDeque::new(),
            stale: true,
            made: Vec::new(),
        };
        // Only a file of this model and build is mapped (a stale one is
        // not read past its index).
        let opened = open_file(&s.file).and_then(|o| match o {
            Some((f, index, data)) if index.identity == s.identity => {
                map_arrays(&f, index, data).map(|m| Some(Some(m)))
            }
            Some(_) => Ok(Some(None)),
            None => Ok(None),
        });
        match opened {
            Ok(Some(Some((map, index)))) => {
                s.map = Some(map);
                s.pending = index.entries.into();
                s.stale = false;
            }
            Ok(Some(None)) => {
                tracing::info!(file = %s.file.display(), "packed-weights cache is stale (model file or build changed): repacking");
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(file = %s.file.display(), error = %e, "packed-weights cache unreadable: repacking");
            }
        }
        Some(s)
    }

    /// The next weight, `name` of `[out, inp]` with bias `b`: read in place
    /// from the cache file when its next entry is this one, else made with
    /// `repack`.
    pub(crate) fn weight(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
        b: Option<Vec<f32>>,
        repack: impl FnOnce(Option<Vec<f32>>) -> Result<Linear, ModelError>,
    ) -> Result<Linear, ModelError> {
        let linear = match self.next_in_file(name, out, inp) {
            Next::Mapped(p) => Linear::from_packed(p, b),
            Next::Unsaved => repack(b)?,
            Next::Mismatch => {
                // Every later entry is suspect too: they are checked one
                // by one, and the file is written again at the end.
                self.stale = true;
                repack(b)?
            }
        };
        self.made.push((name.to_string(), linear.packed()));
        Ok(linear)
    }

    /// What the file's next entry gives for `name` of `[out, inp]`.
    fn next_in_file(&mut self, name: &str, out: usize, inp: usize) -> Next {
        let (Some(e), Some(map)) = (self.pending.pop_front(), &self.map) else {
            return Next::Mismatch;
        };
        if e.name != name || e.out != out || e.inp != inp {
            return Next::Mismatch;
        }
        let Some(kind) = e.kind.as_deref() else {
            return Next::Unsaved;
        };
        let at: Vec<Range<usize>> = e.arrays.iter().map(|&(s, l)| s..s + l).collect();
        let first = at.first().cloned().unwrap_or_default();
        let packed = match kind_named(kind) {
            Some(Kind::KQuant(k)) => {
                PackedKQuant::from_mapped(k, out, inp, map, &at).map(Packed::KQuant)
            }
            Some(Kind::Q8) => PackedQ8::from_mapped(out, inp, map, first).map(Packed::Q8),
            Some(Kind::Dense(d)) => {
                PackedWeight::from_mapped(d, out, inp, map, first).map(Packed::Dense)
            }
            None => None,
        };
        match packed {
            Some(p) => Next::Mapped(p),
            None => Next::Mismatch,
        }
    }

    /// Saves the weights made when the file was missing or did not match
    /// (in the background, or now); a no-op when it matched throughout.
    pub(crate) fn finish(mut self) {
        // (No file, or one of another model or build, starts stale.)
        if !self.stale && self.pending.is_empty() {
            return;
        }
        let made = std::mem::take(&mut self.made);
        let (file, identity, dir) = (
            self.file.clone(),
            self.identity.clone(),
            self.cache.dir.clone(),
        );
        let write = move || {
            let started = Instant::now();
            match write_file(&dir, &file, identity, &made) {
                Ok(bytes) => tracing::info!(
                    file = %file.display(),
                    bytes,
                    seconds = started.elapsed().as_secs_f64(),
                    "saved the packed weights for the next start (--no-packed-weights-cache turns this off)"
                ),
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "could not save the packed weights")
                }
            }
        };
        if self.cache.background {
            let _ = std::thread::Builder::new()
                .name("packed-cache-writer".into())
                .spawn(write);
        } else {
            write();
        }
    }
}

/// A cache file, opened, with its index (ranges counted from the data) and
/// the offset of the data, read from its head without mapping it; `None`
/// when there is no file.
fn open_file(file: &Path) -> std::io::Result<Option<(File, Index, usize)>> {
    let mut f = match File::open(file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let mut head = [0u8; 16];
    f.read_exact(&mut head)
        .map_err(|_| bad("not a packed-weights file"))?;
    if &head[..8] != MAGIC {
        return Err(bad("not a packed-weights file"));
    }
    let len = u64::from_le_bytes(head[8..].try_into().expect("8 bytes"));
    if len > MAX_INDEX_BYTES {
        return Err(bad("index larger than any model's"));
    }
    if len > f.metadata()?.len() {
        return Err(bad("truncated index"));
    }
    let mut json = vec![0u8; len as usize];
    f.read_exact(&mut json)
        .map_err(|_| bad("truncated index"))?;
    let index: Index = serde_json::from_slice(&json).map_err(|e| bad(&e.to_string()))?;
    let data = (16 + json.len()).next_multiple_of(DATA_ALIGN);
    Ok(Some((f, index, data)))
}

/// The file's arrays mapped, and `index` with its ranges as offsets into
/// the map, each checked to lie inside it.
fn map_arrays(f: &File, mut index: Index, data: usize) -> std::io::Result<(Arc<Mmap>, Index)> {
    // SAFETY: read-only. The file is replaced by rename, never written in
    // place, so the mapped inode does not change under us. Populated: the
    // page tables are filled now (from the page cache, or the disk), so
    // the first request does not pay a fault per page of weights.
    let map = Arc::new(unsafe { memmap2::MmapOptions::new().populate().map(f) }?);
    for e in &mut index.entries {
        for (start, l) in &mut e.arrays {
            *start = start
                .checked_add(data)
                .filter(|s| s.checked_add(*l).is_some_and(|end| end <= map.len()))
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "an array lies past the end: truncated?",
                    )
                })?;
        }
    }
    Ok((map, index))
}

/// Writes `made` to a temporary file in `dir` and renames it to `file`;
/// the bytes written.
fn write_file(
    dir: &Path,
    file: &Path,
    identity: Identity,
    made: &[(String, Option<Packed>)],
) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut entries = Vec::with_capacity(made.len());
    let mut arrays: Vec<&[u8]> = Vec::new();
    let mut at = 0usize;
    for (name, w) in made {
        let (kind, out, inp, parts): (_, _, _, Vec<&[u8]>) = match w {
            Some(Packed::KQuant(k)) => (
                Some(Kind::KQuant(k.kind())),
                k.out_dim(),
                k.in_dim(),
                k.panel_bytes().to_vec(),
            ),
            Some(Packed::Dense(d)) => (
                Some(Kind::Dense(d.dtype())),
                d.out_dim(),
                d.in_dim(),
                vec![d.panel_bytes()],
            ),
            Some(Packed::Q8(q)) => (
                Some(Kind::Q8),
                q.out_dim(),
                q.in_dim(),
                vec![q.panel_bytes()],
            ),
            None => (None, 0, 0, Vec::new()),
        };
        let mut ranges = Vec::with_capacity(parts.len());
        for p in parts {
            at = at.next_multiple_of(ARRAY_ALIGN);
            ranges.push((at, p.len()));
            at += p.len();
            arrays.push(p);
        }
        entries.push(Entry {
            name: name.clone(),
            kind: kind.map(|k| kind_name(k).to_string()),
            out,
            inp,
            arrays: ranges,
        });
    }
    let index = serde_json::to_vec(&Index { identity, entries }).map_err(std::io::Error::other)?;
    clean_dir(dir, file);
    let tmp = file.with_extension(format!("panels.tmp.{}", std::process::id()));
    let result = (|| {
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        w.write_all(MAGIC)?;
        w.write_all(&(index.len() as u64).to_le_bytes())?;
        w.write_all(&index)?;
        let head = 16 + index.len();
        w.write_all(&vec![0u8; head.next_multiple_of(DATA_ALIGN) - head])?;
        let mut pos = 0usize;
        for a in &arrays {
            let pad = pos.next_multiple_of(ARRAY_ALIGN) - pos;
            w.write_all(&[0u8; ARRAY_ALIGN][..pad])?;
            w.write_all(a)?;
            pos += pad + a.len();
        }
        w.flush()?;
        drop(w);
        std::fs::rename(&tmp, file)?;
        Ok(head.next_multiple_of(DATA_ALIGN) + pos)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Removes from `dir` what no one will read: the temporary files of
/// writers that died before renaming theirs (a server stopped while
/// saving; Linux only, where a writer's process id tells whether it lives),
/// and the cache files (but `keep`) whose model file is gone (deleted, or
/// moved: a new path gets a new cache file). Files of models that still
/// exist are kept, whatever their age.
fn clean_dir(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let dead = if let Some((_, pid)) = name.split_once(".panels.tmp.") {
            cfg!(target_os = "linux") && !Path::new("/proc").join(pid).exists()
        } else if path != keep && path.extension().is_some_and(|x| x == "panels") {
            match open_file(&path) {
                Ok(Some((_, index, _))) => !Path::new(&index.identity.source).exists(),
                // Not a cache file this build can read: left to its owner.
                _ => false,
            }
        } else {
            false
        };
        if dead {
            tracing::info!(file = %path.display(), "removed a packed-weights file no one will read");
            let _ = std::fs::remove_file(&path);
        }
    }
}

//! The arrays of a packed weight: in the process's own memory (repacked at
//! load) or in place in a mapped file of panels saved by an earlier start
//! (`packed_cache`). Either way a slice to the kernels; clones share.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use memmap2::Mmap;

/// Element types whose every bit pattern is a value, stored little-endian:
/// what a panel array holds, readable in place from a file's bytes.
pub trait Plain: Copy + Send + Sync + 'static {}
impl Plain for u8 {}
impl Plain for i8 {}
impl Plain for u16 {}
impl Plain for f32 {}
// A transparent u16: every bit pattern is a half.
impl Plain for half::f16 {}

/// One array of a packed weight.
pub struct PanelData<T: Plain> {
    inner: Inner<T>,
}

enum Inner<T> {
    Owned(Arc<Vec<T>>),
    /// `len` elements at byte `start` of `map` (aligned for `T`).
    Mapped {
        map: Arc<Mmap>,
        start: usize,
        len: usize,
        _t: PhantomData<T>,
    },
}

impl<T: Plain> Clone for PanelData<T> {
    fn clone(&self) -> Self {
        let inner = match &self.inner {
            Inner::Owned(v) => Inner::Owned(v.clone()),
            Inner::Mapped {
                map, start, len, ..
            } => Inner::Mapped {
                map: map.clone(),
                start: *start,
                len: *len,
                _t: PhantomData,
            },
        };
        Self { inner }
    }
}

impl<T: Plain> From<Vec<T>> for PanelData<T> {
    fn from(v: Vec<T>) -> Self {
        Self {
            inner: Inner::Owned(Arc::new(v)),
        }
    }
}

impl<T: Plain> Default for PanelData<T> {
    fn default() -> Self {
        Vec::new().into()
    }
}

impl<T: Plain> PanelData<T> {
    /// `len` elements at byte `start` of `map`; `None` when they do not lie
    /// inside it or `start` is not aligned for `T` (a file that does not
    /// hold what its index says).
    pub fn mapped(map: Arc<Mmap>, start: usize, len: usize) -> Option<Self> {
        let bytes = len.checked_mul(size_of::<T>())?;
        let end = start.checked_add(bytes)?;
        if end > map.len() || !(map.as_ptr() as usize + start).is_multiple_of(align_of::<T>()) {
            return None;
        }
        Some(Self {
            inner: Inner::Mapped {
                map,
                start,
                len,
                _t: PhantomData,
            },
        })
    }

    /// The elements as little-endian bytes (what a file of panels holds).
    pub fn as_bytes(&self) -> &[u8] {
        let s: &[T] = self;
        // SAFETY: `T` is plain data (`Plain`): its bytes may be read as u8,
        // and the length covers exactly the slice.
        unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
    }

    /// Whether the elements are read in place from a mapped file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.inner, Inner::Mapped { .. })
    }

    /// The elements as a vector of this process's own, copied first when
    /// they were mapped or shared (construction only: loaded weights are
    /// not written).
    pub fn to_mut(&mut self) -> &mut Vec<T> {
        if let Inner::Mapped { .. } = self.inner {
            let owned = self.deref().to_vec();
            self.inner = Inner::Owned(Arc::new(owned));
        }
        match &mut self.inner {
            Inner::Owned(v) => Arc::make_mut(v),
            Inner::Mapped { .. } => unreachable!("made owned above"),
        }
    }
}

impl<T: Plain> Deref for PanelData<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.inner {
            Inner::Owned(v) => v,
            Inner::Mapped {
                map, start, len, ..
            } => {
                // SAFETY: `mapped` checked that `len` elements from `start`
                // lie inside the map and that `start` is aligned for `T`;
                // `T` is plain data, so any bytes are a value. The map is
                // read-only and lives as long as `self`.
                unsafe { std::slice::from_raw_parts(map.as_ptr().add(*start).cast(), *len) }
            }
        }
    }
}

impl<T: Plain + PartialEq> PartialEq for PanelData<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Plain> std::fmt::Debug for PanelData<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "PanelData[{} {how}]", self.len())
    }
}

impl<T: Plain> DerefMut for PanelData<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.to_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn map_of(bytes: &[u8]) -> Arc<Mmap> {
        let path = std::env::temp_dir().join(format!(
            "inferscope-panel-data-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: a private temporary file nobody else writes.
        let map = Arc::new(unsafe { Mmap::map(&f) }.unwrap());
        let _ = std::fs::remove_file(&path);
        map
    }

    #[test]
    fn mapped_arrays_read_the_file_and_copy_on_write() {
        let values = [1.5f32, -2.0, 3.25, 0.0];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let map = map_of(&bytes);
        let mut d = PanelData::<f32>::mapped(map.clone(), 4, 3).expect("inside, aligned");
        assert!(d.is_mapped());
        assert_eq!(&*d, &values[1..]);
        assert_eq!(d.as_bytes(), &bytes[4..]);
        let shared = d.clone();
        d[0] = 7.0;
        assert!(!d.is_mapped(), "a write copies");
        assert_eq!(&*d, &[7.0, 3.25, 0.0]);
        assert_eq!(&*shared, &values[1..], "the file is not written");
        assert!(
            PanelData::<f32>::mapped(map.clone(), 2, 1).is_none(),
            "misaligned"
        );
        assert!(
            PanelData::<f32>::mapped(map.clone(), 8, 3).is_none(),
            "past the end"
        );
        assert!(PanelData::<u8>::mapped(map, 3, 13).is_some());
    }

    #[test]
    fn owned_arrays_share_until_written() {
        let mut a: PanelData<i8> = vec![1, 2, 3].into();
        let b = a.clone();
        a.to_mut().push(4);
        assert_eq!(&*a, &[1, 2, 3, 4]);
        assert_eq!(&*b, &[1, 2, 3]);
    }
}

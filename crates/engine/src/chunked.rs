//! A growable array held in fixed chunks of [`CHUNK`] elements, for the catalog's tables by
//! id (one entry per key, per subtotal series). A `Vec` doubles: right after, up to half
//! its capacity is allocated and unused (at 82 706 keys, 131 072 entries of 48 bytes:
//! 2.3 MB spare), and each doubling copies every entry while the catalog's write lock is
//! held (48 MB at a million keys). Here growth allocates one chunk and copies nothing; at
//! most one chunk is spare. An index costs one more load (the chunk's address, from a
//! short list that stays in cache).

use std::ops::{Index, IndexMut};

const SHIFT: u32 = 12;

/// Elements per chunk.
pub const CHUNK: usize = 1 << SHIFT;

#[derive(Debug)]
pub struct Chunked<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Chunked<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements the chunks have room for.
    pub fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    pub fn push(&mut self, v: T) {
        if self.len == self.capacity() {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        if let Some(last) = self.chunks.last_mut() {
            last.push(v);
            self.len += 1;
        }
    }

    pub fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i >> SHIFT)?.get(i & (CHUNK - 1))
    }

    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.chunks.get_mut(i >> SHIFT)?.get_mut(i & (CHUNK - 1))
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    /// Grows to `n` elements, each new one `v` (never shrinks).
    pub fn grow_to(&mut self, n: usize, v: T)
    where
        T: Clone,
    {
        while self.len < n {
            self.push(v.clone());
        }
    }
}

impl<T> Index<usize> for Chunked<T> {
    type Output = T;

    fn index(&self, i: usize) -> &T {
        &self.chunks[i >> SHIFT][i & (CHUNK - 1)]
    }
}

impl<T> IndexMut<usize> for Chunked<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut self.chunks[i >> SHIFT][i & (CHUNK - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_found_where_they_were_put_across_chunks() {
        let mut c: Chunked<u64> = Chunked::default();
        assert!(c.is_empty() && c.get(0).is_none());
        let n = 3 * CHUNK + 5;
        for i in 0..n {
            c.push(i as u64 * 3);
        }
        assert_eq!((c.len(), c.capacity()), (n, 4 * CHUNK));
        for i in [0, 1, CHUNK - 1, CHUNK, 2 * CHUNK + 7, n - 1] {
            assert_eq!((c[i], c.get(i)), (i as u64 * 3, Some(&(i as u64 * 3))));
        }
        assert_eq!(c.get(n), None);
        c[CHUNK] = 1;
        *c.get_mut(n - 1).unwrap() += 1;
        assert_eq!((c[CHUNK], c[n - 1]), (1, (n as u64 - 1) * 3 + 1));
        assert!(c.iter().copied().eq((0..n).map(|i| match i {
            i if i == CHUNK => 1,
            i if i == n - 1 => i as u64 * 3 + 1,
            i => i as u64 * 3,
        })));
        c.grow_to(n + 2, 9);
        c.grow_to(3, 0);
        assert_eq!((c.len(), c[n + 1]), (n + 2, 9));
    }
}

//! The prefix index of [`CompactUnigram`](crate::CompactUnigram): which piece prefixes exist
//! and which of them are pieces, one hash table per first character, each built the first
//! time a text (or a lookup) needs it.
//!
//! Indexing every prefix of Ruri's 102,400 pieces at once (274,743 distinct prefixes) was most
//! of the tokenizer's load, in a table of several MB whose every insert is a cache miss. Split
//! by first character (1,398 groups in the 30m-shape test vocabulary), a load only groups the
//! piece ids by that character, one sequential pass over the pieces; a text then builds the
//! tables of the characters it has (the benchmark's first query with its prompt: 19 distinct
//! characters, 28,894 pieces, of which 23,412 start with `▁`), and a long workload ends with
//! most of them, together smaller than the one table was (it was sized for every prefix).

use std::hash::BuildHasher;
use std::sync::OnceLock;

use hashbrown::{HashMap, HashTable};

/// The hasher of the index (fixed seed: the index is rebuilt per process and its keys come
/// from the model file, not from callers).
type Hasher = foldhash::fast::FixedState;

fn hasher() -> Hasher {
    foldhash::fast::FixedState::with_seed(0x5275_7269)
}

/// A piece prefix in the index: the first `len` bytes of piece `piece`. When some piece is
/// spelled exactly so, `piece` is that piece (its last id) and [`WHOLE`] is set in `len`.
#[derive(Clone, Copy)]
pub(crate) struct Prefix {
    piece: u32,
    len: u32,
}

/// The bit of [`Prefix::len`] that says the prefix is a piece itself; lengths are below 2³¹
/// (the caller checks that the text of all pieces is).
pub(crate) const WHOLE: u32 = 1 << 31;

impl Prefix {
    fn len(self) -> usize {
        (self.len & !WHOLE) as usize
    }

    /// The id of the piece spelled exactly as this prefix, if any.
    pub(crate) fn id(self) -> Option<u32> {
        (self.len & WHOLE != 0).then_some(self.piece)
    }
}

/// All pieces, concatenated (`text`), and where each ends (piece `i` is
/// `text[bounds[i]..bounds[i + 1]]`).
#[derive(Clone, Copy)]
pub(crate) struct Pieces<'a> {
    pub(crate) text: &'a str,
    pub(crate) bounds: &'a [u32],
}

impl<'a> Pieces<'a> {
    pub(crate) fn get(self, id: usize) -> &'a str {
        &self.text[self.bounds[id] as usize..self.bounds[id + 1] as usize]
    }
}

/// The prefixes of the pieces, grouped by first character; see the module docs.
#[derive(Clone, Debug)]
pub(crate) struct PrefixIndex {
    /// First character → group.
    groups: HashMap<char, u32, Hasher>,
    /// Piece ids, by group; in id order within a group (equal spellings: the last id wins).
    ids: Vec<u32>,
    /// Group `g`'s ids are `ids[starts[g]..starts[g + 1]]`.
    starts: Vec<u32>,
    /// Group `g`'s prefixes, once built.
    tables: Vec<OnceLock<Table>>,
}

/// The prefixes of one group.
#[derive(Clone)]
pub(crate) struct Table(HashTable<Prefix>);

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Table({} prefixes)", self.0.len())
    }
}

impl PrefixIndex {
    /// Groups the non-empty pieces by first character (a counting sort: two passes over the
    /// pieces in id order); no prefix is indexed yet.
    pub(crate) fn new(pieces: Pieces<'_>) -> Self {
        let len = pieces.bounds.len() - 1;
        let mut groups: HashMap<char, u32, Hasher> = HashMap::with_hasher(hasher());
        let mut group_of = Vec::with_capacity(len);
        let mut counts: Vec<u32> = Vec::new();
        for id in 0..len {
            let group = pieces.get(id).chars().next().map(|first| {
                let next = groups.len() as u32;
                let group = *groups.entry(first).or_insert(next);
                if group == next {
                    counts.push(0);
                }
                counts[group as usize] += 1;
                group
            });
            group_of.push(group);
        }
        let mut starts = Vec::with_capacity(counts.len() + 1);
        let mut total = 0;
        starts.push(0);
        for count in &counts {
            total += count;
            starts.push(total);
        }
        let mut next = starts.clone();
        let mut ids = vec![0; total as usize];
        for (id, group) in group_of.into_iter().enumerate() {
            if let Some(group) = group {
                let at = &mut next[group as usize];
                ids[*at as usize] = id as u32;
                *at += 1;
            }
        }
        let tables = (0..counts.len()).map(|_| OnceLock::new()).collect();
        Self {
            groups,
            ids,
            starts,
            tables,
        }
    }

    /// The table of the pieces that start with `first`, built now if no call built it
    /// before; `None` when no piece starts with `first`.
    pub(crate) fn table(&self, first: char, pieces: Pieces<'_>) -> Option<&Table> {
        let group = *self.groups.get(&first)? as usize;
        let ids = &self.ids[self.starts[group] as usize..self.starts[group + 1] as usize];
        Some(self.tables[group].get_or_init(|| Table::build(ids, pieces)))
    }
}

impl Table {
    /// Every prefix at a character boundary of the pieces `ids` (in id order).
    fn build(ids: &[u32], pieces: Pieces<'_>) -> Self {
        let bytes = pieces.text.as_bytes();
        let piece = |id: u32| pieces.get(id as usize).as_bytes();
        // Sized for three distinct prefixes a piece (a Ruri-like vocabulary has 2.7, where
        // every prefix, 6.4 a piece, would double the table); it grows if need be.
        let mut table = HashTable::with_capacity(ids.len().saturating_mul(3));
        let hasher = hasher();
        let rehash = |p: &Prefix| hasher.hash_one(&piece(p.piece)[..p.len()]);
        for &id in ids {
            let spelled = pieces.get(id as usize);
            for (at, c) in spelled.char_indices() {
                let prefix_len = at + c.len_utf8();
                let key = &spelled.as_bytes()[..prefix_len];
                let is_whole = prefix_len == spelled.len();
                let entry = table.entry(
                    hasher.hash_one(key),
                    |p: &Prefix| {
                        let start = pieces.bounds[p.piece as usize] as usize;
                        p.len() == prefix_len && &bytes[start..start + prefix_len] == key
                    },
                    rehash,
                );
                match entry {
                    hashbrown::hash_table::Entry::Occupied(mut slot) => {
                        // Later ids win, as a hash map's insert-overwrite does in
                        // `tokenizers`.
                        if is_whole {
                            *slot.get_mut() = Prefix {
                                piece: id,
                                len: prefix_len as u32 | WHOLE,
                            };
                        }
                    }
                    hashbrown::hash_table::Entry::Vacant(slot) => {
                        slot.insert(Prefix {
                            piece: id,
                            len: prefix_len as u32 | if is_whole { WHOLE } else { 0 },
                        });
                    }
                }
            }
        }
        Table(table)
    }

    /// The entry for `bytes` (which start with this table's character), if some piece
    /// starts with them.
    pub(crate) fn find(&self, bytes: &[u8], pieces: Pieces<'_>) -> Option<Prefix> {
        let text = pieces.text.as_bytes();
        self.0
            .find(hasher().hash_one(bytes), |p| {
                let start = pieces.bounds[p.piece as usize] as usize;
                p.len() == bytes.len() && &text[start..start + bytes.len()] == bytes
            })
            .copied()
    }
}

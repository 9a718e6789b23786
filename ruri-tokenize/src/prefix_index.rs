//! The prefix index of [`CompactUnigram`](crate::CompactUnigram): which piece prefixes exist
//! and which of them are pieces, one hash table per first character, each built the first
//! time a text (or a lookup) needs it.
//!
//! Indexing every prefix of Ruri's 102,400 pieces at once (274,743 distinct prefixes) was most
//! of the tokenizer's load, in a table of several MB whose every insert is a cache miss. Split
//! by first character (1,398 groups in the 30m-shape test vocabulary), and by the first two
//! characters where one character starts more than [`SPLIT_ABOVE`] pieces (23,412 start with
//! `▁`), a load only groups the piece ids, in passes over the pieces in id order; a text then
//! builds the tables of the characters (or pairs) it has, and a long workload ends with most
//! of them, together smaller than the one table was (it was sized for every prefix).

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

/// Groups with more pieces than this are split by their second character, so that a text
/// builds the tables of the character pairs it has rather than, say, every piece that starts
/// with `▁` (23,412 of the 30m-shape vocabulary's 102,400).
pub(crate) const SPLIT_ABOVE: u32 = 1024;

/// What the pieces that start with one character are indexed by.
#[derive(Clone, Copy, Debug)]
enum First {
    /// One group (its number) for all of them.
    Group(u32),
    /// Groups by their first two characters (in [`PrefixIndex::pairs`]); `single` is the
    /// (last) id of the piece spelled as the character alone, if any.
    Split { single: Option<u32> },
}

/// The prefixes of the pieces, grouped by first character (or first two); see the module
/// docs.
#[derive(Clone, Debug)]
pub(crate) struct PrefixIndex {
    firsts: HashMap<char, First, Hasher>,
    /// Group of the pieces (two characters or more) of a split first character, by their
    /// first two characters.
    pairs: HashMap<(char, char), u32, Hasher>,
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

/// The index entries of the prefixes of one text position, found through
/// [`PrefixIndex::at`].
pub(crate) struct At<'a> {
    /// For a split first character: its length in bytes and the piece it spells, if any.
    single: Option<(usize, Option<u32>)>,
    /// The table of the group the longer prefixes belong to, if any.
    table: Option<&'a Table>,
    pieces: Pieces<'a>,
}

impl At<'_> {
    /// The entry for `bytes`, a prefix of the text [`PrefixIndex::at`] was given, if some
    /// piece starts with them.
    pub(crate) fn find(&self, bytes: &[u8]) -> Option<Prefix> {
        if let Some((len, single)) = self.single
            && bytes.len() == len
        {
            // Pieces start with the character (its group was split for having many).
            return Some(Prefix {
                piece: single.unwrap_or(0),
                len: len as u32 | if single.is_some() { WHOLE } else { 0 },
            });
        }
        self.table?.find(bytes, self.pieces)
    }
}

impl PrefixIndex {
    /// Groups the non-empty pieces by first character, and those of a character with many
    /// by their first two (counting sorts: passes over the pieces in id order); no prefix is
    /// indexed yet.
    ///
    /// `split_above` is [`SPLIT_ABOVE`] but in tests.
    pub(crate) fn new(pieces: Pieces<'_>, split_above: u32) -> Self {
        let len = pieces.bounds.len() - 1;
        let mut counts: HashMap<char, u32, Hasher> = HashMap::with_hasher(hasher());
        for id in 0..len {
            if let Some(first) = pieces.get(id).chars().next() {
                *counts.entry(first).or_insert(0) += 1;
            }
        }
        let mut firsts: HashMap<char, First, Hasher> = HashMap::with_hasher(hasher());
        let mut pairs: HashMap<(char, char), u32, Hasher> = HashMap::with_hasher(hasher());
        let mut sizes: Vec<u32> = Vec::new();
        let new_group = |sizes: &mut Vec<u32>| {
            sizes.push(0);
            sizes.len() as u32 - 1
        };
        let mut group_of = Vec::with_capacity(len);
        for id in 0..len {
            let mut chars = pieces.get(id).chars();
            let group = chars.next().and_then(|first| {
                let entry = *firsts.entry(first).or_insert_with(|| {
                    if counts[&first] > split_above {
                        First::Split { single: None }
                    } else {
                        First::Group(new_group(&mut sizes))
                    }
                });
                match (entry, chars.next()) {
                    (First::Group(group), _) => Some(group),
                    (First::Split { .. }, None) => {
                        // Later ids win, as a hash map's insert-overwrite does in
                        // `tokenizers`.
                        firsts.insert(
                            first,
                            First::Split {
                                single: Some(id as u32),
                            },
                        );
                        None
                    }
                    (First::Split { .. }, Some(second)) => Some(
                        *pairs
                            .entry((first, second))
                            .or_insert_with(|| new_group(&mut sizes)),
                    ),
                }
            });
            if let Some(group) = group {
                sizes[group as usize] += 1;
            }
            group_of.push(group);
        }
        let mut starts = Vec::with_capacity(sizes.len() + 1);
        let mut total = 0;
        starts.push(0);
        for size in &sizes {
            total += size;
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
        let tables = (0..sizes.len()).map(|_| OnceLock::new()).collect();
        Self {
            firsts,
            pairs,
            ids,
            starts,
            tables,
        }
    }

    /// The entries of the prefixes of `rest` (the text from one position on), building the
    /// table they are in if no call built it before; `None` when no piece starts with
    /// `rest`'s first character.
    pub(crate) fn at<'a>(&'a self, rest: &str, pieces: Pieces<'a>) -> Option<At<'a>> {
        let mut chars = rest.chars();
        let first = chars.next()?;
        let (single, group) = match *self.firsts.get(&first)? {
            First::Group(group) => (None, Some(group)),
            First::Split { single } => {
                let group = chars
                    .next()
                    .and_then(|second| self.pairs.get(&(first, second)).copied());
                (Some((first.len_utf8(), single)), group)
            }
        };
        let table = group.map(|group| self.table(group as usize, pieces));
        Some(At {
            single,
            table,
            pieces,
        })
    }

    /// Group `group`'s table, built now if no call built it before.
    fn table(&self, group: usize, pieces: Pieces<'_>) -> &Table {
        let ids = &self.ids[self.starts[group] as usize..self.starts[group + 1] as usize];
        self.tables[group].get_or_init(|| Table::build(ids, pieces))
    }
}

impl Table {
    /// Every prefix at a character boundary of the pieces `ids` (in id order).
    fn build(ids: &[u32], pieces: Pieces<'_>) -> Self {
        let bytes = pieces.text.as_bytes();
        let piece = |id: u32| pieces.get(id as usize).as_bytes();
        // Sized for three distinct prefixes a piece (a Ruri-like vocabulary has 2.7, where
        // every prefix, 6.4 a piece, would double the table), or for every prefix when that
        // is fewer (small groups, whose growing would cost more than their build); it grows
        // if need be.
        let prefixes: usize = ids
            .iter()
            .map(|&id| pieces.get(id as usize).chars().count())
            .sum();
        let mut table = HashTable::with_capacity(prefixes.min(ids.len().saturating_mul(3)));
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

    /// The entry for `bytes` (which start as this table's pieces), if some piece starts
    /// with them.
    fn find(&self, bytes: &[u8], pieces: Pieces<'_>) -> Option<Prefix> {
        let text = pieces.text.as_bytes();
        self.0
            .find(hasher().hash_one(bytes), |p| {
                let start = pieces.bounds[p.piece as usize] as usize;
                p.len() == bytes.len() && &text[start..start + bytes.len()] == bytes
            })
            .copied()
    }
}

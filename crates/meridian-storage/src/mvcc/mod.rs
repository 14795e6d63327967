//! Multi-version reads and writes over an [`Engine`]'s `Cf::Data`, at HLC timestamps.
//!
//! Every write creates a new *version* of a user key at a timestamp; nothing is overwritten
//! in place except the key's *latest-version slot*. A read at `read_ts` sees, per key, the
//! newest version with `ts <= read_ts`; if that version is a tombstone the key does not exist
//! at `read_ts`.
//!
//! ```text
//!  Cf::Data, one user key "k" (slot first, then versions newest first thanks to !ts):
//!
//!    03 ‖ enc("k") ‖ 0x00×8 → Latest(30, Put("c"))  copy of the newest version, by exact key
//!    03 ‖ enc("k") ‖ !30    → Put("c")      read at 35 → "c"@30 (answered by the slot alone)
//!    03 ‖ enc("k") ‖ !20    → Tombstone     read at 25 → none
//!    03 ‖ enc("k") ‖ !10    → Put("a")      read at 15 → "a"@10,  read at 5 → none
//! ```
//!
//! # Value encoding
//! The first byte of a `Cf::Data` value is a tag:
//! - `1` = Put, the value bytes follow;
//! - `2` = Tombstone, nothing follows;
//! - `4` = Latest, only ever under a slot key: the newest version's timestamp as a `u64` BE,
//!   then that version's own encoding (`1 ‖ value` or `2`), so at least 10 bytes.
//!
//! Tag `3` was the format-2 slot (timestamp only, no value); format 3 never writes or accepts
//! it, and `RocksEngine::open` refuses format-2 directories. Anything else, or a slot value
//! where a version is expected (and vice versa), is `Error::Corrupt`.
//!
//! # The latest-version slot
//! RocksDB's MultiGet needs *exact* keys, but a version's key contains its timestamp, which a
//! reader does not know. So every [`put`] and [`delete`] also overwrites, in the same
//! `WriteBatch`, the key's slot ([`keys::data_slot_key`], i.e. `data_key(space, key,
//! Timestamp::MAX)`) with the timestamp **and the value** it wrote. A read at or above the
//! newest version is then one exact-key lookup, the same count as a single-version KV store,
//! and MultiGet batches it across keys.
//!
//! **Every value is written twice**, once in its version and once in the slot, on purpose:
//! the hot reads (point reads and BatchGet at "now") must be single exact-key lookups that
//! MultiGet can batch and bloom filters can answer, not iterator seeks nor two dependent
//! lookups (the Flipkart lesson). The version copy is still needed: it is the history for
//! reads below the newest version and for scans. The slot copy is overwritten by the next
//! write to the key and disappears at compaction, so the cost is per write, not per key kept:
//! - WAL and memtable bytes per write about double (key + value twice, plus 9 bytes);
//! - flush and compaction rewrite the live slot copies, about one extra value per live key
//!   at each level it passes through (overwritten slots are dropped when compaction merges
//!   them);
//! - space: one extra copy of each key's newest value (a key with one version takes about
//!   twice its value's bytes; a key with many versions, one value more).
//!
//! The previous format (2) stored only the timestamp in the slot and paid a second, dependent
//! lookup for the value; see "what it costs" for why that was not good enough.
//!
//! Preconditions of the writers (they are what makes the slot right):
//! - **Per key, writes are applied in non-decreasing timestamp order.** The slot holds the
//!   *last write applied*, which is the newest version only because the Raft state machine
//!   gives every write a timestamp above the shard's version floor, and a multi-shard
//!   transaction's write (at its commit timestamp, which may lie below other keys' newer
//!   versions) goes to a key that was locked, so got no version, since its prepare timestamp
//!   was taken above the floor (see `meridian-raft`'s `locks`). A write below the slot's
//!   timestamp would make the slot claim it is the newest and hide the newer version from
//!   reads at or above it.
//! - **Version timestamps are below `Timestamp::MAX`** (at most [`keys::MAX_VERSION_TS`]):
//!   `Timestamp::MAX` is the slot's key. Asserted (in release builds too: a version at `MAX`
//!   would silently overwrite the slot).
//!
//! # Reads
//! - **Point read** ([`get`]): point-get the slot. No slot: the key was never written (every
//!   version is written in one atomic batch with its slot, and snapshots carry the whole data
//!   range), so `None`. Slot ts `<= read_ts`: the slot's copy is the answer (a tombstone reads
//!   as `None`); no second lookup. Slot ts `> read_ts` (a read in the past of a key written
//!   since): fall back to a bounded seek from `data_key(space, key, read_ts)`, which starts
//!   after the slot because the slot sorts first.
//! - **Batched read** ([`multi_get`]): the keys are sorted (the slot keys then come out sorted
//!   too, since the encoding preserves order), and **one** [`Engine::multi_get`] fetches every
//!   slot, which answers every key whose newest version is at or below `read_ts`. Only keys
//!   written after `read_ts` fall back to a seek, all on one reused iterator
//!   ([`Engine::seek_first_many`]). A read at "now" of keys not written in the meantime is one
//!   MultiGet and never creates an iterator.
//! - **Scan** ([`scan`]): one iterator over the user-key range; slots are skipped; per key,
//!   the newest visible version. Forward iteration meets a key's newest version first and
//!   skips the rest. Reverse iteration meets the *oldest* version first, so it keeps the latest
//!   candidate with `ts <= read_ts` and emits it when the user key changes. Scans do not read
//!   the slots' copies: the iterator has to step over the key's versions anyway (it cannot
//!   re-seek past them cheaply; see "not done yet"), so answering from the slot would save
//!   nothing and add a second way to get the same row.
//!
//! # What it costs (measured by `examples/read_paths.rs`)
//! 200k keys × 1 version × 100 random bytes, loaded once per layout, everything in the block
//! cache (CPU per read, not disk I/O); a 2-core machine shared with other builds (load average
//! 3.2–4.4), medians of 7 rotating rounds, median of 3 runs. Throughput relative to format 2
//! (slot = timestamp only, then the exact version) and to format 1 (iterator seek):
//!
//! ```text
//!                              format 3 / format 2    format 3 / seek
//!   get, hit                          1.17x               1.48x
//!   multi_get, 100 hits               1.21x               1.02x
//!   get, miss                         1.00x               5.6x
//!   get below every version           0.92x               0.70x
//! ```
//!
//! - A hit is now one lookup. Batched hits went from 0.86× to about 1.0× the reused-iterator
//!   seeks that format 1 used (in cache, one MultiGet lookup costs about 0.8× a get; a seek on
//!   a warm reused iterator is about as cheap); the gain over seeks should be larger when
//!   blocks come from disk, which MultiGet batches.
//! - A miss is unchanged: one bloom-filtered get.
//! - A read below the newest version pays the slot get (now carrying a value) before its seek:
//!   about 0.92× format 2 and 0.70× a plain seek. Reads in the past are the rare case.
//! - Writes: the keys and values written per version grew from 33.2 to 52.5 MiB (+58%) for
//!   this data set, and that is what the WAL, memtables and the (uncompressed) block cache
//!   carry; loading took about 1.25× as long (noisy). On disk, LZ4 finds the copy in the same
//!   block (the slot sorts right before its newest version): SSTs grew only from 25.2 to
//!   27.1 MiB (+7.5%). Values larger than a block (4 KiB), or a slot and its version split
//!   across a block boundary, pay the copy on disk too.
//!
//! Old versions are garbage-collected below a threshold by `gc` (reads below it must then be
//! refused by the caller).
//!
//! # Invariants
//! - Every user key with at least one version has exactly one slot, holding its newest
//!   version's timestamp and a byte-identical copy of that version's value; no slot exists
//!   without versions.
//! - Writers never create two versions of a key at one timestamp with different values (the
//!   state machine enforces this; a second write at the same timestamp replaces the first,
//!   and the slot is replaced by the same batch either way).
//! - Reads never see versions above `read_ts`, and never return a slot as a row.
//!
//! # Not done yet
//! - Intents are not consulted here; the transaction layer checks them around these reads.
//! - Scans skip invisible versions one by one (no re-seek past a key's remaining versions),
//!   so keys with very many versions make scans slower.
//! - Writes out of timestamp order (e.g. importing history) are not supported: they would
//!   need a read of the current slot before overwriting it.
//! - Large values pay the double write in full; a size threshold above which the slot holds
//!   only the timestamp (two lookups, as in format 2) would bound it.
//!
//! # Layout
//! - `encoding`: the value encoding of versions and latest-version slots ([`VersionValue`],
//!   [`decode_slot`]).
//! - `writes`: [`put`] and [`delete`], each a version plus its slot in one `WriteBatch`.
//! - `point_reads`: [`get`], [`multi_get`] and [`latest_version_ts`], answered by the slots.
//! - `scans`: [`scan`] and its variants, paged and budgeted, forward and reverse.
//! - `tests`: the unit tests of all of the above.
//!
//! [`Engine`]: crate::engine::Engine
//! [`Engine::multi_get`]: crate::engine::Engine::multi_get
//! [`Engine::seek_first_many`]: crate::engine::Engine::seek_first_many
//! [`keys::data_slot_key`]: crate::keys::data_slot_key
//! [`keys::MAX_VERSION_TS`]: crate::keys::MAX_VERSION_TS

use meridian_types::Timestamp;

mod encoding;
mod point_reads;
mod scans;
mod writes;

#[cfg(test)]
mod tests;

pub use encoding::{decode_slot, VersionValue};
pub(crate) use encoding::{decode_version_ref, split_slot};
pub use point_reads::{get, latest_version_ts, multi_get};
pub(crate) use point_reads::{seek_bounds, visible};
pub(crate) use scans::decode_user_key;
pub use scans::{scan, scan_in_window, scan_with_budget, ScanPage};
pub use writes::{delete, put};

/// A visible version: its timestamp and value.
pub type Versioned = (Timestamp, Vec<u8>);

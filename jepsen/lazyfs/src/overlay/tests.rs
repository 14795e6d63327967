//! The overlay against a naive model: two byte vectors, what a reader sees and what a power
//! loss leaves.

use super::*;
use proptest::prelude::*;

/// The naive model: `visible` is updated by every write, `durable` only when the overlay is
/// told to put its writes in the backing file (fsync, write-back, truncate).
#[derive(Default, Debug)]
struct Naive {
    visible: Vec<u8>,
    durable: Vec<u8>,
}

impl Naive {
    fn write(&mut self, offset: usize, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if self.visible.len() < offset + data.len() {
            self.visible.resize(offset + data.len(), 0);
        }
        self.visible[offset..offset + data.len()].copy_from_slice(data);
    }
}

#[derive(Clone, Debug)]
enum Op {
    Write { offset: u16, len: u16, fill: u8 },
    Read { offset: u16, len: u16 },
    Truncate { len: u16 },
    Sync { data_only: bool },
    WriteBack,
    PowerLoss,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Mostly small, dense offsets so writes overlap, touch and extend each other often.
        4 => (0u16..400, 0u16..120, any::<u8>())
            .prop_map(|(offset, len, fill)| Op::Write { offset, len, fill }),
        2 => (0u16..6000, 0u16..700, any::<u8>())
            .prop_map(|(offset, len, fill)| Op::Write { offset, len, fill }),
        3 => (0u16..7000, 0u16..2000).prop_map(|(offset, len)| Op::Read { offset, len }),
        2 => (0u16..500, 0u16..200).prop_map(|(offset, len)| Op::Read { offset, len }),
        1 => (0u16..7000).prop_map(|len| Op::Truncate { len }),
        1 => (0u16..500).prop_map(|len| Op::Truncate { len }),
        1 => any::<bool>().prop_map(|data_only| Op::Sync { data_only }),
        1 => Just(Op::WriteBack),
        1 => Just(Op::PowerLoss),
    ]
}

/// Distinct bytes per write, so a misplaced or reordered write shows.
fn payload(len: u16, fill: u8) -> Vec<u8> {
    (0..len).map(|i| fill.wrapping_add(i as u8)).collect()
}

fn check_whole_file(overlay: &PendingWrites, backing: &MemoryBacking, naive: &Naive) {
    let len = overlay.visible_len(backing.len().unwrap());
    assert_eq!(len, naive.visible.len() as u64, "visible length");
    let all = overlay.read(backing, 0, u32::MAX).unwrap();
    assert_eq!(all, naive.visible, "visible contents");
    assert_eq!(backing.contents, naive.durable, "backing contents");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Reads see every write in order; the backing file (what a power loss leaves) changes only
    /// at fsync, write-back and truncate; a power loss brings the visible file back to it.
    #[test]
    fn overlay_matches_naive_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut overlay = PendingWrites::new();
        let mut backing = MemoryBacking::default();
        let mut naive = Naive::default();
        for op in ops {
            match op {
                Op::Write { offset, len, fill } => {
                    let data = payload(len, fill);
                    overlay.write(u64::from(offset), &data).unwrap();
                    naive.write(usize::from(offset), &data);
                }
                Op::Read { offset, len } => {
                    let got = overlay.read(&backing, u64::from(offset), u32::from(len)).unwrap();
                    let start = usize::from(offset).min(naive.visible.len());
                    let end = (usize::from(offset) + usize::from(len)).min(naive.visible.len());
                    prop_assert_eq!(got, naive.visible[start..end].to_vec());
                }
                Op::Truncate { len } => {
                    overlay.truncate(&mut backing, u64::from(len)).unwrap();
                    naive.visible.resize(usize::from(len), 0);
                    naive.durable = naive.visible.clone();
                }
                Op::Sync { data_only } => {
                    let syncs = backing.syncs;
                    overlay.sync(&mut backing, data_only).unwrap();
                    prop_assert_eq!(backing.syncs, syncs + 1);
                    naive.durable = naive.visible.clone();
                }
                Op::WriteBack => {
                    overlay.write_back(&mut backing).unwrap();
                    naive.durable = naive.visible.clone();
                }
                Op::PowerLoss => {
                    overlay.discard();
                    naive.visible = naive.durable.clone();
                }
            }
            check_whole_file(&overlay, &backing, &naive);
            let data_bytes: u64 = overlay.writes.iter().map(|w| w.data.len() as u64).sum();
            prop_assert_eq!(overlay.data_bytes, data_bytes);
            prop_assert!(overlay.cost_bytes() >= data_bytes);
        }
        // A final power loss leaves exactly the durable bytes, seen through a fresh overlay.
        overlay.discard();
        prop_assert_eq!(overlay.cost_bytes(), 0);
        let fresh = PendingWrites::new();
        prop_assert_eq!(fresh.read(&backing, 0, u32::MAX).unwrap(), naive.durable);
    }
}

/// Sequential appends coalesce into one entry until the entry reaches the cap.
#[test]
fn appends_coalesce_up_to_the_cap() {
    let mut overlay = PendingWrites::new();
    let chunk = vec![7u8; 4096];
    let mut offset = 0;
    while offset < MAX_COALESCED_WRITE_BYTES as u64 {
        overlay.write(offset, &chunk).unwrap();
        offset += chunk.len() as u64;
    }
    assert_eq!(overlay.len(), 1);
    overlay.write(offset, &chunk).unwrap();
    assert_eq!(overlay.len(), 2);
    assert_eq!(
        overlay.cost_bytes(),
        offset + 4096 + 2 * WRITE_OVERHEAD_BYTES
    );
}

/// A write that overlaps an older (not the newest) write is kept as its own entry and wins.
#[test]
fn later_write_wins_over_older_entry() {
    let mut overlay = PendingWrites::new();
    let backing = MemoryBacking::default();
    overlay.write(0, b"aaaa").unwrap();
    overlay.write(100, b"bbbb").unwrap();
    overlay.write(2, b"cc").unwrap();
    assert_eq!(overlay.len(), 3);
    assert_eq!(overlay.read(&backing, 0, 4).unwrap(), b"aacc");
    assert_eq!(overlay.visible_len(0), 104);
    assert_eq!(overlay.read(&backing, 4, 2).unwrap(), vec![0, 0]);
}

/// An offset whose end overflows u64 is refused with EFBIG, and nothing is recorded.
#[test]
fn overflowing_write_is_refused() {
    let mut overlay = PendingWrites::new();
    let err = overlay.write(u64::MAX - 1, b"abc").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EFBIG));
    assert!(overlay.is_empty());
    // A read at an offset near u64::MAX returns nothing rather than overflowing.
    assert!(overlay
        .read(&MemoryBacking::default(), u64::MAX, 10)
        .unwrap()
        .is_empty());
}

/// A backing file that fails its second write: the first write lands, the rest stay pending.
#[test]
fn failed_write_back_keeps_the_unapplied_suffix() {
    struct FailSecond {
        inner: MemoryBacking,
        writes: u32,
    }
    impl Backing for FailSecond {
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            self.inner.read_at(buf, offset)
        }
        fn write_all_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
            self.writes += 1;
            if self.writes == 2 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.inner.write_all_at(data, offset)
        }
        fn sync(&mut self, data_only: bool) -> io::Result<()> {
            self.inner.sync(data_only)
        }
        fn set_len(&mut self, len: u64) -> io::Result<()> {
            self.inner.set_len(len)
        }
    }
    let mut backing = FailSecond {
        inner: MemoryBacking::default(),
        writes: 0,
    };
    let mut overlay = PendingWrites::new();
    overlay.write(10, b"one").unwrap();
    overlay.write(0, b"two").unwrap();
    let err = overlay.sync(&mut backing, true).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(backing.inner.syncs, 0, "no fsync after a failed write-back");
    assert_eq!(overlay.len(), 1);
    assert_eq!(backing.inner.contents, b"\0\0\0\0\0\0\0\0\0\0one");
    assert_eq!(
        overlay.read(&backing, 0, 13).unwrap(),
        b"two\0\0\0\0\0\0\0one"
    );
    overlay.sync(&mut backing, true).unwrap();
    assert!(overlay.is_empty());
    assert_eq!(backing.inner.contents, b"two\0\0\0\0\0\0\0one");
}

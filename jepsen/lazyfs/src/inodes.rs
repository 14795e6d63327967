//! The inode table: FUSE inode numbers ↔ names in the backing directory, and per-inode state.
//!
//! # What
//!
//! The kernel addresses files by inode number; the backing directory by path. Each [`Node`]
//! knows its parent inode and its name, so a path is a walk up to the root and renaming a
//! directory moves its whole subtree by changing one node. A node also carries what the
//! filesystem keeps per file: its open backing [`File`] and its [`PendingWrites`].
//!
//! ```text
//!   names: (parent ino, name) ──► ino          nodes: ino ──► Node { parent, name, lookups,
//!        (1, "db")        ──► 2                                  open_handles, children,
//!        (2, "000012.log") ──► 7                                  file, pending, unlinked }
//!   path(7) = backing / "db" / "000012.log"
//! ```
//!
//! # Invariants
//!
//! - **Numbers are never reused**: a fresh node gets the next number, so a stale kernel
//!   reference can never reach another file.
//! - **A node lives while anything needs it**: the kernel's lookup count (FUSE `forget`
//!   decrements it), open handles, pending writes (they must reach the backing file at fsync or
//!   shutdown even after the kernel forgot the inode), and remembered children (their paths
//!   walk through it). The root lives forever.
//! - **Unlinked nodes have no name**: unlink, rmdir and rename-over remove the name at once; the
//!   node stays (open handles still read and write it through its open backing file) and its
//!   pending writes are dropped when the last handle closes — they can never become durable.
//! - **Bounded**: path walks stop after [`MAX_PATH_DEPTH`] steps (a cycle would be a bug; it
//!   becomes `EIO`, not a hang).
//!
//! # Not modelled
//!
//! - Hard links: the filesystem refuses `link`, so one node has at most one name. A backing
//!   directory that already holds hard links works, but each name is its own node.
//! - Changes made to the backing directory behind the filesystem's back are not noticed.

use crate::overlay::PendingWrites;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The FUSE root inode.
pub const ROOT_INO: u64 = 1;

/// Deepest directory nesting a path walk follows.
pub const MAX_PATH_DEPTH: usize = 4096;

/// What the filesystem keeps for one inode.
#[derive(Debug)]
pub struct Node {
    pub parent: u64,
    pub name: OsString,
    /// Outstanding kernel references (FUSE lookup count).
    pub lookups: u64,
    /// Open file handles (open/create minus release).
    pub open_handles: u32,
    /// Remembered nodes whose parent is this one.
    pub children: u32,
    /// True once unlinked, rmdir'ed or renamed over: the node no longer has a name.
    pub unlinked: bool,
    /// The backing file, open while there are handles or pending writes.
    pub file: Option<File>,
    pub pending: PendingWrites,
    /// Arrival number of the oldest pending write (meaningful only when `pending` is not empty);
    /// the memory bound writes back the file whose pending data is oldest.
    pub oldest_pending_seq: u64,
}

impl Node {
    fn new(parent: u64, name: OsString) -> Self {
        Node {
            parent,
            name,
            lookups: 0,
            open_handles: 0,
            children: 0,
            unlinked: false,
            file: None,
            pending: PendingWrites::new(),
            oldest_pending_seq: 0,
        }
    }

    fn unused(&self) -> bool {
        self.lookups == 0 && self.open_handles == 0 && self.children == 0 && self.pending.is_empty()
    }
}

/// Inode numbers ↔ backing paths.
#[derive(Debug)]
pub struct InodeTable {
    root: PathBuf,
    nodes: HashMap<u64, Node>,
    names: HashMap<(u64, OsString), u64>,
    next_ino: u64,
}

impl InodeTable {
    pub fn new(root: PathBuf) -> Self {
        let mut nodes = HashMap::new();
        let mut root_node = Node::new(ROOT_INO, OsString::new());
        root_node.lookups = 1;
        nodes.insert(ROOT_INO, root_node);
        InodeTable {
            root,
            nodes,
            names: HashMap::new(),
            next_ino: ROOT_INO + 1,
        }
    }

    pub fn root_path(&self) -> &Path {
        &self.root
    }

    pub fn get(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(&ino)
    }

    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Node> {
        self.nodes.get_mut(&ino)
    }

    /// Number of live nodes (the root included).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every inode number, for whole-table passes (shutdown flush, eviction).
    pub fn inos(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// The backing path of a named node; None when unknown, unlinked or too deep.
    pub fn path(&self, ino: u64) -> Option<PathBuf> {
        let mut names = Vec::new();
        let mut at = ino;
        while at != ROOT_INO {
            let node = self.nodes.get(&at)?;
            if node.unlinked || names.len() >= MAX_PATH_DEPTH {
                return None;
            }
            names.push(node.name.as_os_str());
            at = node.parent;
        }
        let mut path = self.root.clone();
        path.extend(names.iter().rev());
        Some(path)
    }

    /// The backing path of `name` in directory `parent`.
    pub fn child_path(&self, parent: u64, name: &OsStr) -> Option<PathBuf> {
        let mut path = self.path(parent)?;
        path.push(name);
        Some(path)
    }

    /// The node currently named `name` in `parent`, if remembered.
    pub fn find(&self, parent: u64, name: &OsStr) -> Option<u64> {
        self.names.get(&(parent, name.to_os_string())).copied()
    }

    /// The node for `name` in `parent`, created if not remembered yet. Does not count a lookup.
    pub fn node_for(&mut self, parent: u64, name: &OsStr) -> u64 {
        if let Some(ino) = self.find(parent, name) {
            return ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes
            .insert(ino, Node::new(parent, name.to_os_string()));
        self.names.insert((parent, name.to_os_string()), ino);
        if let Some(parent_node) = self.nodes.get_mut(&parent) {
            parent_node.children += 1;
        }
        ino
    }

    /// The kernel's `forget`: drops `count` lookups and the node if nothing else needs it.
    pub fn forget(&mut self, ino: u64, count: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(count);
        }
        self.remove_if_unused(ino);
    }

    /// Removes the name `name` from `parent` (unlink, rmdir, or the target of a rename) and marks
    /// its node unlinked. Returns the node, if one was remembered.
    pub fn detach(&mut self, parent: u64, name: &OsStr) -> Option<u64> {
        let ino = self.names.remove(&(parent, name.to_os_string()))?;
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.unlinked = true;
        }
        self.drop_child(parent);
        Some(ino)
    }

    /// Renames a remembered node; the caller has detached any node at the target first.
    pub fn rename(&mut self, parent: u64, name: &OsStr, new_parent: u64, new_name: &OsStr) {
        let Some(ino) = self.names.remove(&(parent, name.to_os_string())) else {
            return;
        };
        self.names
            .insert((new_parent, new_name.to_os_string()), ino);
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.parent = new_parent;
            node.name = new_name.to_os_string();
        }
        if parent != new_parent {
            if let Some(node) = self.nodes.get_mut(&new_parent) {
                node.children += 1;
            }
            self.drop_child(parent);
        }
    }

    /// Forgets the node if nothing needs it any more, then its parent likewise.
    pub fn remove_if_unused(&mut self, ino: u64) {
        let mut at = ino;
        for _ in 0..MAX_PATH_DEPTH {
            if at == ROOT_INO {
                return;
            }
            let Some(node) = self.nodes.get(&at) else {
                return;
            };
            if !node.unused() {
                return;
            }
            let node = self.nodes.remove(&at).expect("checked just above");
            if node.unlinked {
                // Its name and its parent's child count were released at detach.
                return;
            }
            self.names.remove(&(node.parent, node.name));
            let parent = node.parent;
            match self.nodes.get_mut(&parent) {
                Some(parent_node) => parent_node.children = parent_node.children.saturating_sub(1),
                None => return,
            }
            at = parent;
        }
    }

    fn drop_child(&mut self, parent: u64) {
        if let Some(node) = self.nodes.get_mut(&parent) {
            node.children = node.children.saturating_sub(1);
        }
        self.remove_if_unused(parent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> InodeTable {
        InodeTable::new(PathBuf::from("/b"))
    }

    /// Paths follow renames of the node and of a directory above it.
    #[test]
    fn paths_follow_renames() {
        let mut t = table();
        let dir = t.node_for(ROOT_INO, OsStr::new("d"));
        let file = t.node_for(dir, OsStr::new("f"));
        t.get_mut(dir).unwrap().lookups = 1;
        t.get_mut(file).unwrap().lookups = 1;
        assert_eq!(t.path(file).unwrap(), Path::new("/b/d/f"));
        t.rename(ROOT_INO, OsStr::new("d"), ROOT_INO, OsStr::new("e"));
        assert_eq!(t.path(file).unwrap(), Path::new("/b/e/f"));
        t.rename(dir, OsStr::new("f"), ROOT_INO, OsStr::new("g"));
        assert_eq!(t.path(file).unwrap(), Path::new("/b/g"));
        assert_eq!(t.get(dir).unwrap().children, 0);
        assert_eq!(t.get(ROOT_INO).unwrap().children, 2);
        assert_eq!(t.find(ROOT_INO, OsStr::new("g")), Some(file));
        assert_eq!(t.find(dir, OsStr::new("f")), None);
    }

    /// A forgotten node with pending writes stays, and keeps its parent alive for its path.
    #[test]
    fn pending_writes_keep_node_and_parent() {
        let mut t = table();
        let dir = t.node_for(ROOT_INO, OsStr::new("d"));
        let file = t.node_for(dir, OsStr::new("f"));
        t.get_mut(dir).unwrap().lookups = 1;
        t.get_mut(file).unwrap().lookups = 1;
        t.get_mut(file).unwrap().pending.write(0, b"x").unwrap();
        t.forget(file, 1);
        t.forget(dir, 1);
        assert_eq!(t.path(file).unwrap(), Path::new("/b/d/f"));
        t.get_mut(file).unwrap().pending.discard();
        t.remove_if_unused(file);
        assert!(t.get(file).is_none());
        assert!(t.get(dir).is_none(), "parent goes with its last child");
        assert_eq!(t.len(), 1);
        assert_eq!(t.get(ROOT_INO).unwrap().children, 0);
    }

    /// A detached node has no path and its number is never handed out again.
    #[test]
    fn detached_node_has_no_path_and_numbers_are_fresh() {
        let mut t = table();
        let a = t.node_for(ROOT_INO, OsStr::new("a"));
        t.get_mut(a).unwrap().open_handles = 1;
        assert_eq!(t.detach(ROOT_INO, OsStr::new("a")), Some(a));
        assert!(t.path(a).is_none());
        let again = t.node_for(ROOT_INO, OsStr::new("a"));
        assert_ne!(again, a);
        t.get_mut(a).unwrap().open_handles = 0;
        t.remove_if_unused(a);
        assert!(t.get(a).is_none());
        assert_eq!(t.find(ROOT_INO, OsStr::new("a")), Some(again));
    }
}

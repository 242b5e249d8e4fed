//! A lease file of arbitrary content, read the way an operator's listing
//! and every acquire read it: never a panic, and a file that does not
//! decode is reported as unreadable, never as a holder.

#![no_main]

use std::sync::OnceLock;
use std::time::SystemTime;

use libfuzzer_sys::fuzz_target;

fn dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
}

fuzz_target!(|data: &[u8]| {
    let dir = dir();
    std::fs::write(dir.path().join("chat-1.lease"), data).expect("write the lease file");
    let entries =
        flocklease::list_leases(dir.path(), SystemTime::now()).expect("list the directory");
    assert_eq!(entries.len(), 1);
    if let Ok(info) = &entries[0].lease {
        // A record that decodes names its session, or holds nothing.
        if info.owner.is_some() {
            assert!(info.token.is_some(), "a holder without a token: {info:?}");
        }
    }
});

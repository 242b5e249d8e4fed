//! A session file of arbitrary content, read and then written through the
//! JSONL store: never a panic, every failure a typed error, and a write
//! either lands whole (then reads back) or is refused.

#![no_main]

use std::sync::OnceLock;

use lease_port::{FencingToken, OwnerId, SessionId};
use libfuzzer_sys::fuzz_target;
use session_store::{FsyncPolicy, JsonlOptions, JsonlStore, SessionStore, WriteFence};

struct World {
    dir: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
    session: SessionId,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| World {
        dir: tempfile::tempdir().expect("a temporary directory"),
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime"),
        session: SessionId::new("chat-1").expect("a valid id"),
    })
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let file = w.dir.path().join(format!(
        "{}{}",
        session_filename::stem(&w.session),
        session_store::FILE_SUFFIX
    ));
    std::fs::write(&file, data).expect("write the session file");
    // A new store each time: nothing read before is cached.
    let store = JsonlStore::open(
        w.dir.path(),
        JsonlOptions::default().fsync(FsyncPolicy::Never),
    )
    .expect("open the store");
    w.runtime.block_on(async {
        let mut from = 1;
        let mut pages = 0;
        while let Ok(page) = store.read(&w.session, from, 64).await {
            pages += 1;
            match page.next_seq {
                Some(next) if pages < 1000 => {
                    assert!(next > from, "paging went backwards: {from} then {next}");
                    from = next;
                }
                _ => break,
            }
        }
        let fence = WriteFence::new(
            FencingToken::new(u64::MAX - 1),
            OwnerId::new("fuzz").unwrap(),
        );
        let event = serde_json::json!({"type": "fuzz"});
        if let Ok(receipt) = store
            .append(&w.session, fence, std::slice::from_ref(&event))
            .await
        {
            let page = store
                .read(&w.session, receipt.first_seq, 1)
                .await
                .expect("an accepted write reads back");
            assert_eq!(page.events.len(), 1);
            assert_eq!(page.events[0].payload, event);
        }
    });
});

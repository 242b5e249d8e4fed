//! Session and owner ids from arbitrary bytes: validation never panics,
//! and a valid id's file name stem is bounded, made of safe characters,
//! and decodes back to the id when the stem is reversible.

#![no_main]

use lease_port::{MAX_ID_LEN, OwnerId, SessionId};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = OwnerId::new(text);
    let Ok(id) = SessionId::new(text) else {
        assert!(
            text.is_empty() || text.len() > MAX_ID_LEN || text.chars().any(char::is_control),
            "a valid id was refused: {text:?}"
        );
        return;
    };
    let stem = session_filename::stem(&id);
    assert!(stem.len() <= session_filename::MAX_STEM_LEN, "{stem:?}");
    assert!(
        !stem.is_empty() && stem != "." && stem != ".." && !stem.contains('/'),
        "{stem:?}"
    );
    if let Some(decoded) = session_filename::decode(&stem) {
        assert_eq!(decoded, text, "stem {stem:?} decodes to another id");
    }
});

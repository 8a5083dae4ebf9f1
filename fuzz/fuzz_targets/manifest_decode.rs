//! One manifest file through `Manifest::decode`, then as the archive of an engine directory
//! through `Engine::open`; or (flag bit 1) one answers file through `decode_answers`.
//!
//! Input: a flag byte, then the file. Flag bit 0 rewrites the header's length and checksum
//! to match the payload after mutation, so that damage reaches the payload decoder (the
//! two files share the header's layout).
//!
//! Asserts, beyond "no panic": what decodes encodes to bytes that decode to the same
//! manifest, and encoding is deterministic; an engine opened on it either refuses with an
//! error or takes a write that a restart keeps.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tally_engine::Engine;
use tally_engine::manifest::{
    CURRENT, MANIFEST_CRC_OFFSET, MANIFEST_HEADER_LEN, MANIFEST_LEN_OFFSET, Manifest,
    decode_answers, encode_answers, file_name,
};
use tally_fuzz::{assert_a_write_survives_a_restart, engine_config, scratch_dir};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, file)) = data.split_first() else {
        return;
    };
    let mut bytes = file.to_vec();
    if flags & 1 != 0 && bytes.len() >= MANIFEST_HEADER_LEN {
        let len = (bytes.len() - MANIFEST_HEADER_LEN) as u32;
        let crc = crc32c::crc32c(&bytes[MANIFEST_HEADER_LEN..]);
        bytes[MANIFEST_LEN_OFFSET..][..4].copy_from_slice(&len.to_le_bytes());
        bytes[MANIFEST_CRC_OFFSET..][..4].copy_from_slice(&crc.to_le_bytes());
    }
    if flags & 2 != 0 {
        // What decodes encodes to bytes that decode to the same answers.
        if let Ok(answers) = decode_answers(Path::new("fuzz"), &bytes) {
            let again = encode_answers(&answers);
            let back = decode_answers(Path::new("fuzz"), &again).expect("encoded answers decode");
            assert_eq!(back, answers, "answers round trip");
        }
        return;
    }
    let Ok(m) = Manifest::decode(Path::new("fuzz"), &bytes) else {
        return;
    };
    let again = m.encode();
    let back = Manifest::decode(Path::new("fuzz"), &again).expect("an encoded manifest decodes");
    assert_eq!(back, m, "round trip");
    assert_eq!(back.encode(), again, "encoding is deterministic");

    let root = scratch_dir();
    let dir = root.join("data");
    std::fs::create_dir_all(&dir).unwrap();
    let name = file_name(&dir, m.number);
    std::fs::write(&name, &bytes).unwrap();
    let current = format!("{}\n", name.file_name().unwrap().to_string_lossy());
    std::fs::write(dir.join(CURRENT), current).unwrap();
    let Ok(e) = Engine::open(engine_config(&dir, false)) else {
        let _ = std::fs::remove_dir_all(&root);
        return;
    };
    assert_a_write_survives_a_restart(e, &dir);
    let _ = std::fs::remove_dir_all(&root);
});

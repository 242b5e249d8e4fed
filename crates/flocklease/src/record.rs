//! The on-disk lease record: fixed layout, little-endian, checksummed.

use std::path::Path;

use lease_port::{MAX_ID_LEN, OwnerId, SessionId};

use crate::LeaseFileError;

/// The first eight bytes of every lease record.
pub const MAGIC: [u8; 8] = *b"MECLEASE";

/// The record layout this build writes. It also reads version 1 and 2
/// records (see the crate docs, "On-disk format").
pub const FORMAT_VERSION: u16 = 3;

/// Size of a lease record, which is also the size of a written lease file:
/// two 512-byte sectors, each with its own checksum.
pub const RECORD_LEN: usize = 2 * SECTOR;

/// The unit a power cut writes whole or not at all.
pub(crate) const SECTOR: usize = 512;

/// Size of a version 2 record (one checksum over 556 bytes).
pub(crate) const V2_RECORD_LEN: usize = 556;

/// Size of a version 1 record (no reservation ceiling).
pub(crate) const V1_RECORD_LEN: usize = 548;

const OFF_VERSION: usize = 8;
const OFF_STATE: usize = 10;
const OFF_ZERO: usize = 11;
const OFF_SESSION_LEN: usize = 12;
const OFF_OWNER_LEN: usize = 14;
const OFF_TOKEN: usize = 16;
const OFF_EXPIRY: usize = 24;
const OFF_RESERVED: usize = 32;

// Version 3: the header sector (everything a token depends on) ...
const OFF_MONO_EXPIRY: usize = 40;
const OFF_BOOT_ID: usize = 48;
const V3_SESSION: usize = 64;
const V3_HEADER_CRC: usize = SECTOR - 4;
// ... and the owner sector, bound to the header by a copy of its checksum.
const V3_OWNER: usize = SECTOR;
const V3_HEADER_CRC_COPY: usize = RECORD_LEN - 8;
const V3_OWNER_CRC: usize = RECORD_LEN - 4;

const STATE_FREE: u8 = 0;
const STATE_HELD: u8 = 1;

/// Where the variable part of a record version lies.
struct Layout {
    len: usize,
    session: usize,
    owner: usize,
    crc: usize,
    /// Offset of the reservation ceiling; `None` in version 1.
    reserved: Option<usize>,
}

const V2: Layout = Layout {
    len: V2_RECORD_LEN,
    session: 40,
    owner: 40 + MAX_ID_LEN,
    crc: 40 + 2 * MAX_ID_LEN,
    reserved: Some(OFF_RESERVED),
};

const V1: Layout = Layout {
    len: V1_RECORD_LEN,
    session: 32,
    owner: 32 + MAX_ID_LEN,
    crc: 32 + 2 * MAX_ID_LEN,
    reserved: None,
};

// Each layout must add up to its advertised length.
const _: () = assert!(V2.crc + 4 == V2.len && V1.crc + 4 == V1.len);
const _: () = assert!(OFF_RESERVED + 8 == V2.session);
const _: () = assert!(V3_SESSION + MAX_ID_LEN <= V3_HEADER_CRC);
const _: () = assert!(V3_OWNER + MAX_ID_LEN <= V3_HEADER_CRC_COPY);
const _: () = assert!(OFF_BOOT_ID + 16 == V3_SESSION);

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The full session id (file names may be hashed).
    pub(crate) session: SessionId,
    /// The holder, or `None` once released (or when `holder_lost`).
    pub(crate) owner: Option<OwnerId>,
    /// Held, but the owner sector did not survive a torn write: the holder
    /// is unknown. Such a hold is honoured until its expiry, and the next
    /// token jumps past the ceiling.
    pub(crate) holder_lost: bool,
    /// The highest token issued for the session.
    pub(crate) token: u64,
    /// The reservation ceiling: every token ever returned for the session is
    /// at most the value last made durable here. Never below `token`. A
    /// version 1 record reads as `reserved == token` (version 1 synced every
    /// token).
    pub(crate) reserved: u64,
    /// Expiry in nanoseconds since the Unix epoch; 0 when free.
    pub(crate) expiry_nanos: u64,
    /// Expiry on the monotonic clock of boot `boot_id`, in nanoseconds; 0
    /// when free or unknown (versions 1 and 2).
    pub(crate) mono_expiry_nanos: u64,
    /// The boot the monotonic expiry belongs to; zero when unknown.
    pub(crate) boot_id: [u8; 16],
}

impl Record {
    /// The record in the current layout ([`FORMAT_VERSION`]).
    pub(crate) fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[OFF_STATE] = if self.owner.is_some() || self.holder_lost {
            STATE_HELD
        } else {
            STATE_FREE
        };
        let session = self.session.as_str().as_bytes();
        let owner = self
            .owner
            .as_ref()
            .map_or(&[][..], |o| o.as_str().as_bytes());
        // Ids are validated to at most MAX_ID_LEN (256) bytes, so both the
        // u16 lengths and the fixed fields hold them.
        b[OFF_SESSION_LEN..OFF_SESSION_LEN + 2]
            .copy_from_slice(&(session.len() as u16).to_le_bytes());
        b[OFF_OWNER_LEN..OFF_OWNER_LEN + 2].copy_from_slice(&(owner.len() as u16).to_le_bytes());
        b[OFF_TOKEN..OFF_TOKEN + 8].copy_from_slice(&self.token.to_le_bytes());
        b[OFF_EXPIRY..OFF_EXPIRY + 8].copy_from_slice(&self.expiry_nanos.to_le_bytes());
        b[OFF_RESERVED..OFF_RESERVED + 8].copy_from_slice(&self.reserved.to_le_bytes());
        b[OFF_MONO_EXPIRY..OFF_MONO_EXPIRY + 8]
            .copy_from_slice(&self.mono_expiry_nanos.to_le_bytes());
        b[OFF_BOOT_ID..OFF_BOOT_ID + 16].copy_from_slice(&self.boot_id);
        b[V3_SESSION..V3_SESSION + session.len()].copy_from_slice(session);
        let header_crc = crc32fast::hash(&b[..V3_HEADER_CRC]);
        b[V3_HEADER_CRC..SECTOR].copy_from_slice(&header_crc.to_le_bytes());
        b[V3_OWNER..V3_OWNER + owner.len()].copy_from_slice(owner);
        b[V3_HEADER_CRC_COPY..V3_OWNER_CRC].copy_from_slice(&header_crc.to_le_bytes());
        let owner_crc = crc32fast::hash(&b[SECTOR..V3_OWNER_CRC]);
        b[V3_OWNER_CRC..].copy_from_slice(&owner_crc.to_le_bytes());
        b
    }

    /// Decodes a version 3 record (`bytes` is exactly [`RECORD_LEN`] long).
    fn decode_v3(path: &Path, bytes: &[u8]) -> Result<Record, LeaseFileError> {
        let stored = u32::from_le_bytes(le4(&bytes[V3_HEADER_CRC..]));
        let computed = crc32fast::hash(&bytes[..V3_HEADER_CRC]);
        if stored != computed {
            return Err(LeaseFileError::Checksum {
                path: path.to_path_buf(),
                stored,
                computed,
            });
        }
        let malformed = |detail: String| LeaseFileError::Malformed {
            path: path.to_path_buf(),
            detail,
        };
        if bytes[OFF_ZERO] != 0 {
            return Err(malformed("reserved byte is not zero".into()));
        }
        let (session_len, owner_len) = id_lens(bytes).map_err(malformed)?;
        let token = u64::from_le_bytes(le8(&bytes[OFF_TOKEN..]));
        let expiry_nanos = u64::from_le_bytes(le8(&bytes[OFF_EXPIRY..]));
        let reserved = u64::from_le_bytes(le8(&bytes[OFF_RESERVED..]));
        let mono_expiry_nanos = u64::from_le_bytes(le8(&bytes[OFF_MONO_EXPIRY..]));
        let mut boot_id = [0u8; 16];
        boot_id.copy_from_slice(&bytes[OFF_BOOT_ID..OFF_BOOT_ID + 16]);
        if reserved < token {
            return Err(malformed(format!(
                "token {token} above its reservation ceiling {reserved}"
            )));
        }
        let session = std::str::from_utf8(&bytes[V3_SESSION..V3_SESSION + session_len])
            .ok()
            .and_then(|s| SessionId::new(s).ok())
            .ok_or_else(|| malformed("stored session id is not a valid id".into()))?;
        if !bytes[V3_SESSION + session_len..V3_HEADER_CRC]
            .iter()
            .all(|&b| b == 0)
        {
            return Err(malformed("padding after the session id is not zero".into()));
        }
        let state = bytes[OFF_STATE];
        let held = match state {
            STATE_FREE if owner_len == 0 && expiry_nanos == 0 && mono_expiry_nanos == 0 => false,
            STATE_HELD if owner_len > 0 && token > 0 => true,
            _ => {
                return Err(malformed(format!(
                    "state {state} with owner length {owner_len}, token {token}, expiry {expiry_nanos}"
                )));
            }
        };
        // The owner sector counts only if it is whole and written with this
        // very header; otherwise a power cut tore the record between them.
        let owner_sector_whole = u32::from_le_bytes(le4(&bytes[V3_OWNER_CRC..]))
            == crc32fast::hash(&bytes[SECTOR..V3_OWNER_CRC])
            && bytes[V3_HEADER_CRC_COPY..V3_OWNER_CRC] == bytes[V3_HEADER_CRC..SECTOR];
        let owner = match (held, owner_sector_whole) {
            (false, _) | (true, false) => None,
            (true, true) => {
                let owner = std::str::from_utf8(&bytes[V3_OWNER..V3_OWNER + owner_len])
                    .ok()
                    .and_then(|s| OwnerId::new(s).ok())
                    .ok_or_else(|| malformed("stored owner id is not a valid id".into()))?;
                if !bytes[V3_OWNER + owner_len..V3_HEADER_CRC_COPY]
                    .iter()
                    .all(|&b| b == 0)
                {
                    return Err(malformed("padding after the owner id is not zero".into()));
                }
                Some(owner)
            }
        };
        Ok(Record {
            session,
            holder_lost: held && owner.is_none(),
            owner,
            token,
            reserved,
            expiry_nanos,
            mono_expiry_nanos,
            boot_id,
        })
    }

    /// Decodes the bytes of a whole file (`bytes` may be longer or shorter
    /// than a record), in the current layout or in version 1. `Ok(None)`:
    /// empty or all-zero, a file created but never written, so no token was
    /// ever issued from it.
    pub(crate) fn decode(path: &Path, bytes: &[u8]) -> Result<Option<Record>, LeaseFileError> {
        let path_buf = || path.to_path_buf();
        let zero_len = [RECORD_LEN, V2_RECORD_LEN, V1_RECORD_LEN].contains(&bytes.len());
        if bytes.is_empty() || (zero_len && bytes.iter().all(|&b| b == 0)) {
            return Ok(None);
        }
        let prefix = bytes.len().min(MAGIC.len());
        if bytes[..prefix] != MAGIC[..prefix] {
            return Err(LeaseFileError::Foreign { path: path_buf() });
        }
        if bytes.len() < OFF_VERSION + 2 {
            return Err(LeaseFileError::Truncated {
                path: path_buf(),
                len: bytes.len() as u64,
            });
        }
        let version = u16::from_le_bytes([bytes[OFF_VERSION], bytes[OFF_VERSION + 1]]);
        let layout = match version {
            FORMAT_VERSION if bytes.len() == RECORD_LEN => {
                return Self::decode_v3(path, bytes).map(Some);
            }
            FORMAT_VERSION if bytes.len() < RECORD_LEN => {
                return Err(LeaseFileError::Truncated {
                    path: path_buf(),
                    len: bytes.len() as u64,
                });
            }
            FORMAT_VERSION => {
                return Err(LeaseFileError::Oversized {
                    path: path_buf(),
                    len: bytes.len() as u64,
                });
            }
            2 => &V2,
            1 => &V1,
            found => {
                return Err(LeaseFileError::Version {
                    path: path_buf(),
                    found,
                });
            }
        };
        Self::decode_legacy(path, bytes, layout).map(Some)
    }

    /// Decodes a record of an older version in `layout` (2 or 1), from the
    /// bytes of a whole file.
    fn decode_legacy(path: &Path, bytes: &[u8], layout: &Layout) -> Result<Record, LeaseFileError> {
        let path_buf = || path.to_path_buf();
        if bytes.len() < layout.len {
            return Err(LeaseFileError::Truncated {
                path: path_buf(),
                len: bytes.len() as u64,
            });
        }
        if bytes.len() > layout.len {
            return Err(LeaseFileError::Oversized {
                path: path_buf(),
                len: bytes.len() as u64,
            });
        }
        let stored = u32::from_le_bytes(le4(&bytes[layout.crc..]));
        let computed = crc32fast::hash(&bytes[..layout.crc]);
        if stored != computed {
            return Err(LeaseFileError::Checksum {
                path: path_buf(),
                stored,
                computed,
            });
        }
        let malformed = |detail: String| LeaseFileError::Malformed {
            path: path_buf(),
            detail,
        };
        let state = bytes[OFF_STATE];
        if bytes[OFF_ZERO] != 0 {
            return Err(malformed("reserved byte is not zero".into()));
        }
        let (session_len, owner_len) = id_lens(bytes).map_err(malformed)?;
        let token = u64::from_le_bytes(le8(&bytes[OFF_TOKEN..]));
        let expiry_nanos = u64::from_le_bytes(le8(&bytes[OFF_EXPIRY..]));
        let reserved = layout
            .reserved
            .map_or(token, |off| u64::from_le_bytes(le8(&bytes[off..])));
        if reserved < token {
            return Err(malformed(format!(
                "token {token} above its reservation ceiling {reserved}"
            )));
        }
        let session = std::str::from_utf8(&bytes[layout.session..layout.session + session_len])
            .ok()
            .and_then(|s| SessionId::new(s).ok())
            .ok_or_else(|| malformed("stored session id is not a valid id".into()))?;
        let owner = match state {
            STATE_FREE if owner_len == 0 && expiry_nanos == 0 => None,
            STATE_HELD if owner_len > 0 && token > 0 => Some(
                std::str::from_utf8(&bytes[layout.owner..layout.owner + owner_len])
                    .ok()
                    .and_then(|s| OwnerId::new(s).ok())
                    .ok_or_else(|| malformed("stored owner id is not a valid id".into()))?,
            ),
            _ => {
                return Err(malformed(format!(
                    "state {state} with owner length {owner_len}, token {token}, expiry {expiry_nanos}"
                )));
            }
        };
        let padding_clean = bytes[layout.session + session_len..layout.owner]
            .iter()
            .chain(&bytes[layout.owner + owner_len..layout.crc])
            .all(|&b| b == 0);
        if !padding_clean {
            return Err(malformed("padding after an id is not zero".into()));
        }
        Ok(Record {
            session,
            owner,
            holder_lost: false,
            token,
            reserved,
            expiry_nanos,
            mono_expiry_nanos: 0,
            boot_id: [0; 16],
        })
    }
}

/// The session and owner id lengths, each at most [`MAX_ID_LEN`].
fn id_lens(bytes: &[u8]) -> Result<(usize, usize), String> {
    let session_len =
        u16::from_le_bytes([bytes[OFF_SESSION_LEN], bytes[OFF_SESSION_LEN + 1]]) as usize;
    let owner_len = u16::from_le_bytes([bytes[OFF_OWNER_LEN], bytes[OFF_OWNER_LEN + 1]]) as usize;
    if session_len > MAX_ID_LEN || owner_len > MAX_ID_LEN {
        return Err(format!(
            "id lengths {session_len}/{owner_len} exceed {MAX_ID_LEN}"
        ));
    }
    Ok((session_len, owner_len))
}

fn le4(b: &[u8]) -> [u8; 4] {
    let mut out = [0; 4];
    out.copy_from_slice(&b[..4]);
    out
}

fn le8(b: &[u8]) -> [u8; 8] {
    let mut out = [0; 8];
    out.copy_from_slice(&b[..8]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn path() -> &'static Path {
        Path::new("/leases/x.lease")
    }

    fn held() -> Record {
        Record {
            session: SessionId::new("chat/7 ☕").unwrap(),
            owner: Some(OwnerId::new("host-a/4242").unwrap()),
            holder_lost: false,
            token: 42,
            reserved: 1065,
            expiry_nanos: 1_767_225_600_123_456_789,
            mono_expiry_nanos: 987_654_321_000,
            boot_id: *b"0123456789abcdef",
        }
    }

    /// `r` in an older layout (1 or 2), as older builds wrote it.
    fn encode_legacy(r: &Record, version: u16) -> Vec<u8> {
        let layout = if version == 1 { &V1 } else { &V2 };
        let v3 = r.encode();
        let mut b = vec![0u8; layout.len];
        b[..OFF_RESERVED].copy_from_slice(&v3[..OFF_RESERVED]);
        b[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&version.to_le_bytes());
        if let Some(off) = layout.reserved {
            b[off..off + 8].copy_from_slice(&r.reserved.to_le_bytes());
        }
        b[layout.session..layout.owner].copy_from_slice(&v3[V3_SESSION..V3_SESSION + MAX_ID_LEN]);
        b[layout.owner..layout.crc].copy_from_slice(&v3[V3_OWNER..V3_OWNER + MAX_ID_LEN]);
        let crc = crc32fast::hash(&b[..layout.crc]);
        b[layout.crc..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn encode_v1(r: &Record) -> Vec<u8> {
        encode_legacy(r, 1)
    }

    /// Recomputes both checksums (and the header's copy) of a version 3
    /// record after an edit.
    fn reseal(b: &mut [u8]) {
        let crc = crc32fast::hash(&b[..V3_HEADER_CRC]);
        b[V3_HEADER_CRC..SECTOR].copy_from_slice(&crc.to_le_bytes());
        b[V3_HEADER_CRC_COPY..V3_OWNER_CRC].copy_from_slice(&crc.to_le_bytes());
        let crc = crc32fast::hash(&b[SECTOR..V3_OWNER_CRC]);
        b[V3_OWNER_CRC..].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn version_2_records_are_read() {
        let r = Record {
            mono_expiry_nanos: 0,
            boot_id: [0; 16],
            ..held()
        };
        let v2 = encode_legacy(&r, 2);
        assert_eq!(v2.len(), V2_RECORD_LEN);
        assert_eq!(Record::decode(path(), &v2).unwrap(), Some(r));
        // A version 2 record torn at its sector boundary cannot be trusted:
        // an error that names the repair, never a guess.
        let mut next = held();
        next.token = 43;
        let mut torn = v2.clone();
        torn[..SECTOR].copy_from_slice(&encode_legacy(&next, 2)[..SECTOR]);
        let err = Record::decode(path(), &torn).unwrap_err();
        assert!(matches!(err, LeaseFileError::Checksum { .. }), "{err}");
        assert!(err.to_string().contains("repair"), "{err}");
    }

    #[test]
    fn a_torn_owner_sector_keeps_the_token_and_loses_only_the_holder() {
        let old = held().encode();
        let mut next = held();
        next.token = 43;
        next.owner = Some(OwnerId::new("host-b/1").unwrap());
        let new = next.encode();
        for (header, owner) in [(&old, &new), (&new, &old)] {
            let mut torn = header.to_vec();
            torn[SECTOR..].copy_from_slice(&owner[SECTOR..]);
            let r = Record::decode(path(), &torn).unwrap().unwrap();
            let from = Record::decode(path(), header).unwrap().unwrap();
            assert!(r.holder_lost && r.owner.is_none());
            assert_eq!((r.token, r.reserved), (from.token, from.reserved));
            assert_eq!(r.expiry_nanos, from.expiry_nanos);
        }
        // A torn header sector is an error naming the repair.
        let mut torn = old.to_vec();
        torn[..SECTOR / 2].copy_from_slice(&new[..SECTOR / 2]);
        let err = Record::decode(path(), &torn).unwrap_err();
        assert!(matches!(err, LeaseFileError::Checksum { .. }), "{err}");
    }

    #[test]
    fn round_trips_held_and_free() {
        let r = held();
        assert_eq!(
            Record::decode(path(), &r.encode()).unwrap(),
            Some(r.clone())
        );
        let free = Record {
            owner: None,
            expiry_nanos: 0,
            mono_expiry_nanos: 0,
            ..r
        };
        assert_eq!(Record::decode(path(), &free.encode()).unwrap(), Some(free));
    }

    #[test]
    fn longest_ids_fit() {
        let r = Record {
            session: SessionId::new("s".repeat(MAX_ID_LEN)).unwrap(),
            owner: Some(OwnerId::new("é".repeat(MAX_ID_LEN / 2)).unwrap()),
            ..held()
        };
        assert_eq!(Record::decode(path(), &r.encode()).unwrap(), Some(r));
    }

    #[test]
    fn empty_and_all_zero_files_are_unwritten() {
        assert_eq!(Record::decode(path(), &[]).unwrap(), None);
        assert_eq!(Record::decode(path(), &[0; RECORD_LEN]).unwrap(), None);
        assert_eq!(Record::decode(path(), &[0; V1_RECORD_LEN]).unwrap(), None);
        assert_eq!(Record::decode(path(), &[0; V2_RECORD_LEN]).unwrap(), None);
    }

    #[test]
    fn damage_is_named() {
        let good = held().encode();
        let err = Record::decode(path(), &good[..100]).unwrap_err();
        assert!(
            matches!(err, LeaseFileError::Truncated { len: 100, .. }),
            "{err}"
        );
        let err = Record::decode(path(), &good[..3]).unwrap_err();
        assert!(
            matches!(err, LeaseFileError::Truncated { len: 3, .. }),
            "{err}"
        );
        let err = Record::decode(path(), &[0; 17]).unwrap_err();
        assert!(matches!(err, LeaseFileError::Foreign { .. }), "{err}");
        let err = Record::decode(path(), b"hello world").unwrap_err();
        assert!(matches!(err, LeaseFileError::Foreign { .. }), "{err}");
        let mut long = good.to_vec();
        long.push(0);
        let err = Record::decode(path(), &long).unwrap_err();
        assert!(matches!(err, LeaseFileError::Oversized { .. }), "{err}");
        let mut flipped = good;
        flipped[OFF_TOKEN] ^= 1;
        let err = Record::decode(path(), &flipped).unwrap_err();
        assert!(matches!(err, LeaseFileError::Checksum { .. }), "{err}");
        let mut newer = good;
        newer[OFF_VERSION] = 4;
        let err = Record::decode(path(), &newer).unwrap_err();
        assert!(
            matches!(err, LeaseFileError::Version { found: 4, .. }),
            "{err}"
        );
        // Damage inside the header sector: half of a new header over the old.
        let mut next = held();
        next.token = 43;
        next.owner = Some(OwnerId::new("host-b/1").unwrap());
        let mut torn = good;
        torn[..SECTOR / 2].copy_from_slice(&next.encode()[..SECTOR / 2]);
        let err = Record::decode(path(), &torn).unwrap_err();
        assert!(matches!(err, LeaseFileError::Checksum { .. }), "{err}");
    }

    #[test]
    fn inconsistent_fields_behind_a_valid_checksum_are_malformed() {
        let mut b = held().encode();
        b[OFF_STATE] = STATE_FREE; // free, but with an owner
        reseal(&mut b);
        let err = Record::decode(path(), &b).unwrap_err();
        assert!(matches!(err, LeaseFileError::Malformed { .. }), "{err}");
    }

    #[test]
    fn a_token_above_its_reservation_is_malformed() {
        let mut b = held().encode();
        b[OFF_RESERVED..OFF_RESERVED + 8].copy_from_slice(&41u64.to_le_bytes());
        reseal(&mut b);
        let err = Record::decode(path(), &b).unwrap_err();
        assert!(
            matches!(&err, LeaseFileError::Malformed { detail, .. } if detail.contains("ceiling")),
            "{err}"
        );
    }

    #[test]
    fn the_checksum_covers_the_reservation() {
        let mut b = held().encode();
        b[OFF_RESERVED] ^= 0x01;
        let err = Record::decode(path(), &b).unwrap_err();
        assert!(matches!(err, LeaseFileError::Checksum { .. }), "{err}");
    }

    #[test]
    fn version_1_records_read_with_the_token_as_their_reservation() {
        let r = held();
        let v1 = encode_v1(&r);
        let decoded = Record::decode(path(), &v1).unwrap().unwrap();
        assert_eq!(
            decoded,
            Record {
                reserved: r.token,
                mono_expiry_nanos: 0,
                boot_id: [0; 16],
                ..r.clone()
            }
        );
        // Version 1 at the current length, or the current version at the
        // old length, is damage, not a record.
        let mut long = v1.clone();
        long.resize(RECORD_LEN, 0);
        let err = Record::decode(path(), &long).unwrap_err();
        assert!(matches!(err, LeaseFileError::Oversized { .. }), "{err}");
        let err = Record::decode(path(), &r.encode()[..V1_RECORD_LEN]).unwrap_err();
        assert!(matches!(err, LeaseFileError::Truncated { .. }), "{err}");
        let mut flipped = v1;
        flipped[OFF_TOKEN] ^= 1;
        let err = Record::decode(path(), &flipped).unwrap_err();
        assert!(matches!(err, LeaseFileError::Checksum { .. }), "{err}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let _ = Record::decode(path(), &bytes);
        }

        #[test]
        fn any_single_bit_flip_is_detected(byte in 0..RECORD_LEN, bit in 0..8u8) {
            // In the header: an error. In the owner sector: the holder is
            // lost, nothing else.
            let mut b = held().encode();
            b[byte] ^= 1 << bit;
            match Record::decode(path(), &b) {
                Err(_) => prop_assert!(byte < SECTOR),
                Ok(r) => {
                    let r = r.unwrap();
                    prop_assert!(byte >= SECTOR && r.holder_lost && r.owner.is_none());
                    prop_assert_eq!((r.token, r.reserved), (held().token, held().reserved));
                }
            }
        }

        #[test]
        fn any_single_bit_flip_of_a_version_1_record_is_detected(byte in 0..V1_RECORD_LEN, bit in 0..8u8) {
            let mut b = encode_v1(&held());
            b[byte] ^= 1 << bit;
            prop_assert!(Record::decode(path(), &b).is_err());
        }
    }
}

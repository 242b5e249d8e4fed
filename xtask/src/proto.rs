//! `cargo xtask proto [--check | --bless]`: the gRPC contract.
//!
//! `proto/` holds the contract; the Rust code generated from it is checked
//! in under `crates/grpcdriver/src/gen/`, so users of the crate need neither
//! `protoc` nor a build script. Three artefacts come from the one `.proto`:
//!
//! - the generated Rust (`mecatl.lease.v1.rs`), rewritten by `proto`;
//! - the descriptor set reflection serves (`mecatl.lease.v1.binpb` beside
//!   it), rewritten by `proto`;
//! - the *baseline* descriptor set `proto/mecatl/lease/v1/lease.v1.binpb`:
//!   the contract as released. `--check` (run by CI) fails when the
//!   generated files are stale or when the `.proto` breaks wire
//!   compatibility with the baseline; `--bless` rewrites the baseline after
//!   a compatible change.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, FileDescriptorProto, FileDescriptorSet,
    ServiceDescriptorProto,
};

use crate::{Result, workspace_root};

const PROTO_ROOT: &str = "proto";
const CONTRACT: &str = "mecatl/lease/v1/lease.proto";
const BASELINE: &str = "proto/mecatl/lease/v1/lease.v1.binpb";
const GEN_DIR: &str = "crates/grpcdriver/src/gen";
const GEN_RUST: &str = "mecatl.lease.v1.rs";
const GEN_DESCRIPTOR: &str = "mecatl.lease.v1.binpb";

pub(crate) fn proto(args: &[String]) -> Result {
    let root = workspace_root();
    let mode = match args {
        [] => Mode::Write,
        [flag] if flag == "--check" => Mode::Check,
        [flag] if flag == "--bless" => Mode::Bless,
        _ => return Err("usage: cargo xtask proto [--check | --bless]".into()),
    };
    let current = compile(&root)?;
    let generated = generate(&current)?;
    let gen_dir = root.join(GEN_DIR);
    let files = [
        (gen_dir.join(GEN_RUST), generated.into_bytes()),
        (gen_dir.join(GEN_DESCRIPTOR), current.encode_to_vec()),
    ];
    let baseline_path = root.join(BASELINE);
    match mode {
        Mode::Write | Mode::Bless => {
            for (path, bytes) in &files {
                write_if_changed(path, bytes)?;
            }
            if mode == Mode::Bless {
                write_if_changed(&baseline_path, &current.encode_to_vec())?;
                println!("baseline rewritten: {}", baseline_path.display());
            } else {
                check_against_baseline(&baseline_path, &current)?;
            }
        }
        Mode::Check => {
            for (path, bytes) in &files {
                if fs::read(path).ok().as_deref() != Some(bytes.as_slice()) {
                    return Err(format!(
                        "{} is not what {CONTRACT} generates: run `cargo xtask proto` and commit",
                        path.display()
                    ));
                }
            }
            check_against_baseline(&baseline_path, &current)?;
            println!("proto: generated code fresh, wire-compatible with the baseline");
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Write,
    Check,
    Bless,
}

fn check_against_baseline(path: &Path, current: &FileDescriptorSet) -> Result {
    let bytes = fs::read(path).map_err(|e| {
        format!(
            "read the baseline {}: {e} (a new contract is blessed once with `cargo xtask proto --bless`)",
            path.display()
        )
    })?;
    let baseline = FileDescriptorSet::decode(bytes.as_slice())
        .map_err(|e| format!("decode the baseline {}: {e}", path.display()))?;
    let breaks = wire_breaks(&baseline, current);
    if breaks.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{CONTRACT} breaks wire compatibility with {BASELINE}:\n  {}",
            breaks.join("\n  ")
        ))
    }
}

/// Compiles the contract with protox (no system `protoc`), imports and
/// source info included so generated code keeps the documentation.
fn compile(root: &Path) -> Result<FileDescriptorSet> {
    let mut compiler =
        protox::Compiler::new([root.join(PROTO_ROOT)]).map_err(|e| format!("protox: {e}"))?;
    compiler.include_imports(true).include_source_info(true);
    compiler
        .open_file(CONTRACT)
        .map_err(|e| format!("compile {CONTRACT}: {e}"))?;
    let mut set = compiler.file_descriptor_set();
    // Paths in source info are absolute on no machine, but keep the set
    // free of anything but the files themselves.
    set.file.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(set)
}

fn generate(set: &FileDescriptorSet) -> Result<String> {
    let out = tempdir()?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(&out)
        .compile_fds(set.clone())
        .map_err(|e| format!("generate Rust from {CONTRACT}: {e}"))?;
    let path = out.join(GEN_RUST);
    let code = fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()));
    let _ = fs::remove_dir_all(&out);
    code
}

fn tempdir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("xtask-proto-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    Ok(dir)
}

fn write_if_changed(path: &Path, bytes: &[u8]) -> Result {
    if fs::read(path).ok().as_deref() == Some(bytes) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    fs::write(path, bytes).map_err(|e| format!("write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Every change from `old` to `new` that a peer built against `old` would
/// misread on the wire: a message, enum, service, method or field removed;
/// a field renumbered, retyped or moved in or out of `repeated`; a method's
/// input, output or streaming changed; an enum value renumbered. Added
/// fields, values and methods are compatible, and so are renamed fields
/// (names are not on the wire) as long as the number and type stay.
pub(crate) fn wire_breaks(old: &FileDescriptorSet, new: &FileDescriptorSet) -> Vec<String> {
    let old_files = index_files(old);
    let new_files = index_files(new);
    let mut breaks = Vec::new();
    for (name, old_file) in &old_files {
        let Some(new_file) = new_files.get(name) else {
            breaks.push(format!("file {name} removed"));
            continue;
        };
        let pkg = old_file.package();
        let new_messages = index_messages(pkg, &new_file.message_type);
        for (path, old_msg) in index_messages(pkg, &old_file.message_type) {
            match new_messages.get(&path) {
                None => breaks.push(format!("message {path} removed")),
                Some(new_msg) => message_breaks(&path, old_msg, new_msg, &mut breaks),
            }
        }
        let new_enums = index_enums(pkg, &new_file.message_type, &new_file.enum_type);
        for (path, old_enum) in index_enums(pkg, &old_file.message_type, &old_file.enum_type) {
            match new_enums.get(&path) {
                None => breaks.push(format!("enum {path} removed")),
                Some(new_enum) => enum_breaks(&path, old_enum, new_enum, &mut breaks),
            }
        }
        for old_svc in &old_file.service {
            let path = format!("{pkg}.{}", old_svc.name());
            match new_file.service.iter().find(|s| s.name == old_svc.name) {
                None => breaks.push(format!("service {path} removed")),
                Some(new_svc) => service_breaks(&path, old_svc, new_svc, &mut breaks),
            }
        }
    }
    breaks
}

fn index_files(set: &FileDescriptorSet) -> BTreeMap<String, &FileDescriptorProto> {
    set.file.iter().map(|f| (f.name().to_owned(), f)).collect()
}

fn index_messages<'a>(
    prefix: &str,
    messages: &'a [DescriptorProto],
) -> BTreeMap<String, &'a DescriptorProto> {
    let mut out = BTreeMap::new();
    for m in messages {
        let path = format!("{prefix}.{}", m.name());
        out.extend(index_messages(&path, &m.nested_type));
        out.insert(path, m);
    }
    out
}

fn index_enums<'a>(
    prefix: &str,
    messages: &'a [DescriptorProto],
    enums: &'a [EnumDescriptorProto],
) -> BTreeMap<String, &'a EnumDescriptorProto> {
    let mut out: BTreeMap<String, &EnumDescriptorProto> = enums
        .iter()
        .map(|e| (format!("{prefix}.{}", e.name()), e))
        .collect();
    for m in messages {
        let path = format!("{prefix}.{}", m.name());
        out.extend(index_enums(&path, &m.nested_type, &m.enum_type));
    }
    out
}

fn message_breaks(path: &str, old: &DescriptorProto, new: &DescriptorProto, out: &mut Vec<String>) {
    for old_field in &old.field {
        let number = old_field.number();
        let Some(new_field) = new.field.iter().find(|f| f.number() == number) else {
            out.push(format!(
                "{path}: field {} (= {number}) removed",
                old_field.name()
            ));
            continue;
        };
        let (ot, nt) = (old_field.r#type(), new_field.r#type());
        if ot != nt || (is_named(ot) && old_field.type_name() != new_field.type_name()) {
            out.push(format!(
                "{path}: field {} (= {number}) changed type from {} to {}",
                old_field.name(),
                describe(ot, old_field.type_name()),
                describe(nt, new_field.type_name()),
            ));
        }
        let repeated = |l: Label| l == Label::Repeated;
        if repeated(old_field.label()) != repeated(new_field.label()) {
            out.push(format!(
                "{path}: field {} (= {number}) moved in or out of repeated",
                old_field.name()
            ));
        }
        let oneof = |f: &prost_types::FieldDescriptorProto, m: &DescriptorProto| {
            f.oneof_index
                .filter(|_| !f.proto3_optional())
                .and_then(|i| m.oneof_decl.get(usize::try_from(i).ok()?))
                .map(|o| o.name().to_owned())
        };
        if oneof(old_field, old) != oneof(new_field, new) {
            out.push(format!(
                "{path}: field {} (= {number}) moved in or out of a oneof",
                old_field.name()
            ));
        }
    }
}

fn is_named(t: Type) -> bool {
    matches!(t, Type::Message | Type::Enum | Type::Group)
}

fn describe(t: Type, name: &str) -> String {
    if is_named(t) {
        name.trim_start_matches('.').to_owned()
    } else {
        t.as_str_name()
            .trim_start_matches("TYPE_")
            .to_ascii_lowercase()
    }
}

fn enum_breaks(
    path: &str,
    old: &EnumDescriptorProto,
    new: &EnumDescriptorProto,
    out: &mut Vec<String>,
) {
    for value in &old.value {
        match new.value.iter().find(|v| v.name == value.name) {
            None => out.push(format!("{path}: value {} removed", value.name())),
            Some(v) if v.number != value.number => out.push(format!(
                "{path}: value {} renumbered from {} to {}",
                value.name(),
                value.number(),
                v.number()
            )),
            Some(_) => {}
        }
    }
}

fn service_breaks(
    path: &str,
    old: &ServiceDescriptorProto,
    new: &ServiceDescriptorProto,
    out: &mut Vec<String>,
) {
    for m in &old.method {
        let Some(n) = new.method.iter().find(|n| n.name == m.name) else {
            out.push(format!("{path}: method {} removed", m.name()));
            continue;
        };
        if m.input_type != n.input_type || m.output_type != n.output_type {
            out.push(format!(
                "{path}: method {} changed its request or response type",
                m.name()
            ));
        }
        if m.client_streaming() != n.client_streaming()
            || m.server_streaming() != n.server_streaming()
        {
            out.push(format!("{path}: method {} changed streaming", m.name()));
        }
    }
}

#[cfg(test)]
mod tests {
    //! The check must catch each kind of break, and pass the contract as it
    //! stands against its own baseline.

    use super::*;

    fn current() -> FileDescriptorSet {
        compile(&workspace_root()).expect("the contract compiles")
    }

    fn msg<'a>(set: &'a mut FileDescriptorSet, name: &str) -> &'a mut DescriptorProto {
        set.file
            .iter_mut()
            .flat_map(|f| f.message_type.iter_mut())
            .find(|m| m.name() == name)
            .expect("message exists")
    }

    fn field<'a>(
        set: &'a mut FileDescriptorSet,
        message: &str,
        name: &str,
    ) -> &'a mut prost_types::FieldDescriptorProto {
        msg(set, message)
            .field
            .iter_mut()
            .find(|f| f.name() == name)
            .expect("field exists")
    }

    #[test]
    fn the_contract_matches_its_committed_baseline() {
        let bytes = fs::read(workspace_root().join(BASELINE)).expect("baseline committed");
        let baseline = FileDescriptorSet::decode(bytes.as_slice()).unwrap();
        assert_eq!(wire_breaks(&baseline, &current()), Vec::<String>::new());
    }

    #[test]
    fn an_unchanged_contract_has_no_breaks() {
        assert!(wire_breaks(&current(), &current()).is_empty());
    }

    #[test]
    fn additions_and_renames_are_compatible() {
        let old = current();
        let mut new = old.clone();
        let mut added = field(&mut new, "Lease", "token").clone();
        added.name = Some("note".into());
        added.number = Some(99);
        added.r#type = Some(Type::String.into());
        msg(&mut new, "Lease").field.push(added);
        field(&mut new, "Lease", "owner").name = Some("holder".into());
        assert_eq!(wire_breaks(&old, &new), Vec::<String>::new());
    }

    #[test]
    fn a_removed_field_is_a_break() {
        let old = current();
        let mut new = old.clone();
        msg(&mut new, "Lease").field.retain(|f| f.name() != "token");
        let breaks = wire_breaks(&old, &new);
        assert!(
            breaks
                .iter()
                .any(|b| b.contains("field token (= 3) removed")),
            "{breaks:?}"
        );
    }

    #[test]
    fn a_renumbered_field_is_a_break() {
        let old = current();
        let mut new = old.clone();
        field(&mut new, "LeaseRef", "token").number = Some(7);
        assert!(!wire_breaks(&old, &new).is_empty());
    }

    #[test]
    fn a_changed_type_is_a_break() {
        let old = current();
        let mut new = old.clone();
        field(&mut new, "Lease", "token").r#type = Some(Type::Int64.into());
        let breaks = wire_breaks(&old, &new);
        assert!(
            breaks.iter().any(|b| b.contains("from uint64 to int64")),
            "{breaks:?}"
        );
        let mut new = old.clone();
        field(&mut new, "AcquireResponse", "lease").type_name =
            Some(".mecatl.lease.v1.LeaseRef".into());
        assert!(!wire_breaks(&old, &new).is_empty());
    }

    #[test]
    fn repeated_and_streaming_changes_are_breaks() {
        let old = current();
        let mut new = old.clone();
        field(&mut new, "BatchRenewRequest", "leases").label = Some(Label::Optional.into());
        assert!(!wire_breaks(&old, &new).is_empty());
        let mut new = old.clone();
        for f in &mut new.file {
            for s in &mut f.service {
                for m in &mut s.method {
                    if m.name() == "KeepAlive" {
                        m.client_streaming = Some(false);
                    }
                }
            }
        }
        assert!(!wire_breaks(&old, &new).is_empty());
    }

    #[test]
    fn removed_methods_and_renumbered_enum_values_are_breaks() {
        let old = current();
        let mut new = old.clone();
        for f in &mut new.file {
            for s in &mut f.service {
                s.method.retain(|m| m.name() != "Get");
            }
            for e in &mut f.enum_type {
                for v in &mut e.value {
                    if v.name() == "LEASE_LOST" {
                        v.number = Some(42);
                    }
                }
            }
        }
        let breaks = wire_breaks(&old, &new);
        assert!(
            breaks.iter().any(|b| b.contains("method Get removed")),
            "{breaks:?}"
        );
        assert!(
            breaks.iter().any(|b| b.contains("LEASE_LOST renumbered")),
            "{breaks:?}"
        );
    }
}

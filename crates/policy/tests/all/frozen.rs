//! A released contract version is frozen: its WIT never changes. A policy built against
//! it must keep loading and behave the same, so the host's bindings for that version
//! must keep describing exactly what the policy was built with.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use yardmaster_policy::contract::{Binding, ContractVersion, ACCEPTED};

/// Every released version's WIT files and their SHA-256. A new release adds its line;
/// no line ever changes.
const RELEASED: &[(&str, &str, &str)] = &[
    ("0.1.0", "policy.wit", "797261bcddc4cbe379f7193aed738dcc1d3985cdaea1a220e7b526784964dda0"),
    ("0.2.0", "policy.wit", "fd91f5a6c239e3636bcf52c3331b859e9342c258d235d8a20bf6bd72069e0cdc"),
    ("0.3.0", "policy.wit", "863fe49b9286b19ef433bbe99b4c2567a9bc330d92d28732f79a18cbeeb7227b"),
];

fn wit() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit")
}

#[test]
fn released_wit_files_are_unchanged() {
    for (version, file, sha256) in RELEASED {
        let path = wit().join(version).join(file);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let found = hex::encode(Sha256::digest(&bytes));
        assert_eq!(
            &found,
            sha256,
            "{} changed, but contract {version} is released and frozen: put the change in a new version directory (see wit/README.md)",
            path.display()
        );
    }
}

#[test]
fn every_version_directory_is_pinned_or_a_draft_and_every_accepted_one_is_bound() {
    let newest_release = RELEASED.iter().filter_map(|(v, _, _)| ContractVersion::parse(v)).max().expect("a released version");
    for entry in std::fs::read_dir(wit()).unwrap().flatten() {
        if !entry.file_type().unwrap().is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let version = ContractVersion::parse(&name).unwrap_or_else(|| panic!("wit/{name} is not a MAJOR.MINOR.PATCH version directory"));
        let released = RELEASED.iter().any(|(v, _, _)| *v == name);
        if released {
            for file in std::fs::read_dir(entry.path()).unwrap().flatten() {
                let file = file.file_name().to_string_lossy().into_owned();
                assert!(RELEASED.iter().any(|(v, f, _)| *v == name && *f == file), "wit/{name}/{file} was added to a released version");
            }
        } else {
            assert!(
                version > newest_release,
                "wit/{name} is older than the newest release {newest_release} but was never released (pinned)"
            );
        }
        if ACCEPTED.contains(version) {
            assert!(Binding::for_version(version).is_ok(), "wit/{name} is in the accepted range but has no bindings module");
        }
    }
}

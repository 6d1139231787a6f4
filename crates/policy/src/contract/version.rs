//! Contract versions: the version a component says it was built against (the version
//! of its `yardmaster:policy/policy` export) and the range of versions a host accepts.

use std::fmt;

/// The interface every policy exports; the version it carries is the contract version
/// the component was built against.
pub const POLICY_EXPORT: &str = "yardmaster:policy/policy";

/// A released version of the `yardmaster:policy` package (`MAJOR.MINOR.PATCH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContractVersion {
    /// Incompatible changes once the contract reaches 1.0.
    pub major: u32,
    /// Below 1.0, any change of the records, variants or functions (a new field, a new
    /// action): a new minor version is a new contract.
    pub minor: u32,
    /// Changes that leave every type and function as it was.
    pub patch: u32,
}

impl ContractVersion {
    /// `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self { major, minor, patch }
    }

    /// Parse `MAJOR.MINOR.PATCH` (decimal numbers without leading zeros). A pre-release
    /// or build suffix (`0.2.0-draft`) is not a released contract and does not parse.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split('.');
        let mut number = || {
            let part = parts.next()?;
            let plain = !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) && (part == "0" || !part.starts_with('0'));
            plain.then(|| part.parse().ok()).flatten()
        };
        let version = Self::new(number()?, number()?, number()?);
        parts.next().is_none().then_some(version)
    }
}

impl fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A range of contract versions, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The oldest version still accepted.
    pub oldest: ContractVersion,
    /// The newest version accepted (the host's latest).
    pub latest: ContractVersion,
}

impl Accepted {
    /// Whether `version` is in the range.
    pub fn contains(&self, version: ContractVersion) -> bool {
        self.oldest <= version && version <= self.latest
    }
}

impl fmt::Display for Accepted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.oldest == self.latest {
            write!(f, "{} only", self.latest)
        } else {
            write!(f, "{} to {}", self.oldest, self.latest)
        }
    }
}

/// Why a component's contract version could not be determined or is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// The component has no `yardmaster:policy/policy` export at all.
    #[error("it does not export the {POLICY_EXPORT} interface")]
    NoPolicyExport,
    /// The component exports the policy interface at a version the host has no bindings
    /// for (or at no version, or one that is not `MAJOR.MINOR.PATCH`).
    #[error("it was built against yardmaster:policy@{found}")]
    Unsupported {
        /// The version the component carries, as written in its export's name
        /// (`none` when the export is unversioned).
        found: String,
    },
}

/// The contract version a component was built against, read from the names of its
/// exports (`yardmaster:policy/policy@0.1.0` → 0.1.0). Whether the host accepts it is
/// [`super::Binding::for_version`]'s question.
pub fn exported_version<'a>(exports: impl IntoIterator<Item = &'a str>) -> Result<ContractVersion, VersionError> {
    let export = exports
        .into_iter()
        .find(|name| name.split_once('@').map_or(*name, |(interface, _)| interface) == POLICY_EXPORT)
        .ok_or(VersionError::NoPolicyExport)?;
    let found = export.split_once('@').map_or("none", |(_, version)| version);
    ContractVersion::parse(found).ok_or_else(|| VersionError::Unsupported { found: found.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_only_as_three_plain_numbers() {
        assert_eq!(ContractVersion::parse("0.1.0"), Some(ContractVersion::new(0, 1, 0)));
        assert_eq!(ContractVersion::parse("12.0.345"), Some(ContractVersion::new(12, 0, 345)));
        for bad in ["", "0.1", "0.1.0.0", "0.1.x", "v0.1.0", "0.1.0-draft", "0.1.0+build", "0.01.0", "0..0", " 0.1.0", "-1.0.0"] {
            assert_eq!(ContractVersion::parse(bad), None, "{bad:?}");
        }
        assert_eq!(ContractVersion::new(0, 1, 0).to_string(), "0.1.0");
    }

    #[test]
    fn versions_order_by_major_minor_patch() {
        let v = ContractVersion::new;
        assert!(v(0, 1, 0) < v(0, 1, 1) && v(0, 1, 9) < v(0, 2, 0) && v(0, 9, 9) < v(1, 0, 0));
    }

    #[test]
    fn the_range_includes_both_ends() {
        let v = ContractVersion::new;
        let range = Accepted { oldest: v(0, 1, 0), latest: v(0, 2, 0) };
        assert!(range.contains(v(0, 1, 0)) && range.contains(v(0, 1, 5)) && range.contains(v(0, 2, 0)));
        assert!(!range.contains(v(0, 0, 9)) && !range.contains(v(0, 2, 1)) && !range.contains(v(1, 0, 0)));
        assert_eq!(range.to_string(), "0.1.0 to 0.2.0");
        assert_eq!(Accepted { oldest: v(0, 1, 0), latest: v(0, 1, 0) }.to_string(), "0.1.0 only");
    }

    #[test]
    fn the_version_is_read_from_the_policy_export() {
        let exports = ["wasi:cli/run@0.2.6", "yardmaster:policy/policy@0.1.0"];
        assert_eq!(exported_version(exports), Ok(ContractVersion::new(0, 1, 0)));
        assert_eq!(exported_version(["yardmaster:policy/policy@3.4.5"]), Ok(ContractVersion::new(3, 4, 5)));
        // Only the policy interface counts, not a look-alike name.
        assert_eq!(exported_version(["yardmaster:policy/policy-extra@0.1.0"]), Err(VersionError::NoPolicyExport));
        assert_eq!(exported_version(["yardmaster:policy/types@0.1.0"]), Err(VersionError::NoPolicyExport));
        assert_eq!(exported_version([]), Err(VersionError::NoPolicyExport));
        assert_eq!(exported_version(["yardmaster:policy/policy"]), Err(VersionError::Unsupported { found: "none".into() }));
        assert_eq!(exported_version(["yardmaster:policy/policy@0.2.0-rc1"]), Err(VersionError::Unsupported { found: "0.2.0-rc1".into() }));
    }
}

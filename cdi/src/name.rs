//! CDI names: kinds (`vendor/class`), device names, and fully-qualified device names
//! (`vendor/class=name`), with the character rules of the CDI specification.
//!
//! - vendor and class: start with a letter, end with a letter or digit; letters, digits,
//!   `_`, `-`, `.` in between.
//! - device name: starts and ends with a letter or digit; letters, digits, `_`, `-`, `.`, `:`
//!   in between (`:` allows MIG-style names such as `0:1`).

use std::fmt;

/// Why a name was refused. The message names the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The text is not of the form `vendor/class=name`.
    #[error("unqualified device {0:?}, expected vendor/class=name")]
    Unqualified(String),
    /// The kind is not of the form `vendor/class`.
    #[error("invalid kind {0:?}, expected vendor/class")]
    Kind(String),
    /// The vendor part breaks the character rules.
    #[error("invalid vendor {name:?}: {reason}")]
    Vendor {
        /// The vendor text.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The class part breaks the character rules.
    #[error("invalid class {name:?}: {reason}")]
    Class {
        /// The class text.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The device name breaks the character rules.
    #[error("invalid device name {name:?}: {reason}")]
    Device {
        /// The device name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

fn check_vendor_or_class(name: &str) -> Result<(), &'static str> {
    let bytes = name.as_bytes();
    let (first, last) = match (bytes.first(), bytes.last()) {
        (Some(f), Some(l)) => (*f, *l),
        _ => return Err("empty name"),
    };
    if !first.is_ascii_alphabetic() {
        return Err("should start with a letter");
    }
    if bytes.len() > 2
        && !bytes[1..bytes.len() - 1]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
    {
        return Err("may only contain letters, digits, '_', '-' and '.'");
    }
    if !last.is_ascii_alphanumeric() {
        return Err("should end with a letter or digit");
    }
    Ok(())
}

/// Checks a vendor name (the part of a kind before `/`).
pub fn validate_vendor_name(vendor: &str) -> Result<(), NameError> {
    check_vendor_or_class(vendor).map_err(|reason| NameError::Vendor {
        name: vendor.to_string(),
        reason,
    })
}

/// Checks a class name (the part of a kind after `/`).
pub fn validate_class_name(class: &str) -> Result<(), NameError> {
    check_vendor_or_class(class).map_err(|reason| NameError::Class {
        name: class.to_string(),
        reason,
    })
}

/// Checks a device name (the part of a qualified name after `=`).
pub fn validate_device_name(name: &str) -> Result<(), NameError> {
    let err = |reason| NameError::Device {
        name: name.to_string(),
        reason,
    };
    let bytes = name.as_bytes();
    let (first, last) = match (bytes.first(), bytes.last()) {
        (Some(f), Some(l)) => (*f, *l),
        _ => return Err(err("empty name")),
    };
    if !first.is_ascii_alphanumeric() {
        return Err(err("should start with a letter or digit"));
    }
    if bytes.len() > 2
        && !bytes[1..bytes.len() - 1]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b':'))
    {
        return Err(err(
            "may only contain letters, digits, '_', '-', '.' and ':'",
        ));
    }
    if !last.is_ascii_alphanumeric() {
        return Err(err("should end with a letter or digit"));
    }
    Ok(())
}

/// Splits a kind `vendor/class` at its first `/` and checks both parts.
pub fn parse_kind(kind: &str) -> Result<(&str, &str), NameError> {
    match kind.split_once('/') {
        Some((vendor, class)) if !vendor.is_empty() && !class.is_empty() => {
            validate_vendor_name(vendor)?;
            validate_class_name(class)?;
            Ok((vendor, class))
        }
        _ => Err(NameError::Kind(kind.to_string())),
    }
}

/// A fully-qualified CDI device name, `vendor/class=name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QualifiedName {
    /// The vendor, e.g. `gpushare.io`.
    pub vendor: String,
    /// The class, e.g. `claim`.
    pub class: String,
    /// The device name within the kind.
    pub name: String,
}

impl QualifiedName {
    /// Parses and checks `vendor/class=name`. A text that starts with `/` or has no `=` is
    /// [`NameError::Unqualified`]; a part breaking the character rules is named in the error.
    pub fn parse(text: &str) -> Result<QualifiedName, NameError> {
        let unqualified = || NameError::Unqualified(text.to_string());
        if text.starts_with('/') {
            return Err(unqualified());
        }
        let (kind, name) = text.split_once('=').ok_or_else(unqualified)?;
        if kind.is_empty() || name.is_empty() {
            return Err(unqualified());
        }
        let (vendor, class) = match kind.split_once('/') {
            Some((v, c)) if !v.is_empty() && !c.is_empty() => (v, c),
            _ => return Err(unqualified()),
        };
        validate_vendor_name(vendor)?;
        validate_class_name(class)?;
        validate_device_name(name)?;
        Ok(QualifiedName {
            vendor: vendor.to_string(),
            class: class.to_string(),
            name: name.to_string(),
        })
    }

    /// The kind part, `vendor/class`.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}", self.vendor, self.class, self.name)
    }
}

/// True when `text` is a valid fully-qualified device name.
pub fn is_qualified_name(text: &str) -> bool {
    QualifiedName::parse(text).is_ok()
}

/// Builds `vendor/class=name` from a kind and a device name (no checks).
pub fn qualified_name(kind: &str, name: &str) -> String {
    format!("{kind}={name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names_parse() {
        let q = QualifiedName::parse("nvidia.com/gpu=0").unwrap();
        assert_eq!(
            (q.vendor.as_str(), q.class.as_str(), q.name.as_str()),
            ("nvidia.com", "gpu", "0")
        );
        assert_eq!(q.kind(), "nvidia.com/gpu");
        assert_eq!(q.to_string(), "nvidia.com/gpu=0");
        for good in [
            "gpushare.io/claim=3f2a-uid",
            "nvidia.com/gpu=0:1",
            "nvidia.com/gpu=MIG-abc_def.1",
            "a/b=c",
            "vendor.example/class-x_y.z=GPU-1234",
            "a.b-c_d/e=f",
        ] {
            assert!(is_qualified_name(good), "{good}");
        }
    }

    #[test]
    fn unqualified_and_invalid_names_are_refused() {
        for unqualified in [
            "",
            "0",
            "/dev/nvidia0",
            "nvidia.com/gpu",
            "=x",
            "nvidia.com=0",
            "/gpu=0",
            "nvidia.com/=0",
            "nvidia.com/gpu=",
        ] {
            assert!(
                matches!(
                    QualifiedName::parse(unqualified),
                    Err(NameError::Unqualified(_))
                ),
                "{unqualified}"
            );
        }
        assert!(matches!(
            QualifiedName::parse("1vendor/gpu=0"),
            Err(NameError::Vendor { .. })
        ));
        assert!(matches!(
            QualifiedName::parse("vendor-/gpu=0"),
            Err(NameError::Vendor { .. })
        ));
        assert!(matches!(
            QualifiedName::parse("ven dor/gpu=0"),
            Err(NameError::Vendor { .. })
        ));
        assert!(matches!(
            QualifiedName::parse("vendor/_gpu=0"),
            Err(NameError::Class { .. })
        ));
        assert!(matches!(
            QualifiedName::parse("vendor/gp/u=0"),
            Err(NameError::Class { .. })
        ));
        assert!(matches!(
            QualifiedName::parse("vendor/gpu=-0"),
            Err(NameError::Device { .. })
        ));
        assert!(matches!(
            QualifiedName::parse("vendor/gpu=0:"),
            Err(NameError::Device { .. })
        ));
        assert!(matches!(
            QualifiedName::parse("vendor/gpu=a/b"),
            Err(NameError::Device { .. })
        ));
        assert!(matches!(
            QualifiedName::parse("vendor/gpu=a=b"),
            Err(NameError::Device { .. })
        ));
        let err = QualifiedName::parse("vendor/gpu=bad!").unwrap_err();
        assert!(err.to_string().contains("bad!"), "{err}");
    }

    #[test]
    fn single_character_parts_are_fine() {
        assert!(validate_vendor_name("a").is_ok());
        assert!(validate_class_name("b").is_ok());
        assert!(validate_device_name("0").is_ok());
        assert!(validate_vendor_name("1").is_err());
        assert!(validate_device_name("_").is_err());
        assert!(validate_device_name("").is_err());
        assert!(validate_device_name("a:").is_err());
        assert!(validate_device_name("a:b").is_ok());
    }

    #[test]
    fn kinds_parse() {
        assert_eq!(
            parse_kind("gpushare.io/claim").unwrap(),
            ("gpushare.io", "claim")
        );
        assert!(matches!(parse_kind("claim"), Err(NameError::Kind(_))));
        assert!(matches!(parse_kind("/claim"), Err(NameError::Kind(_))));
        assert!(matches!(parse_kind("x/"), Err(NameError::Kind(_))));
        assert!(matches!(parse_kind("x/a/b"), Err(NameError::Class { .. })));
        assert!(matches!(parse_kind("-x/a"), Err(NameError::Vendor { .. })));
        assert_eq!(qualified_name("a.com/b", "c"), "a.com/b=c");
    }
}

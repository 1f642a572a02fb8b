//! Strict decoding of CDI spec files (JSON and YAML) and loading with validation.

use std::path::{Path, PathBuf};

use crate::model::Spec;
use crate::validate::{validate_spec, SpecError};

/// The encoding of a spec file, chosen by its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecFormat {
    /// `*.json`
    Json,
    /// `*.yaml` (`*.yml` is not a spec file name, as in the reference scanner).
    Yaml,
}

impl SpecFormat {
    /// The format for a file name ending in `.json` or `.yaml` (a name that is only the suffix,
    /// such as `.json`, counts too, as the reference scanner matches by suffix); anything else
    /// `None`.
    pub fn from_path(path: &Path) -> Option<SpecFormat> {
        let name = path.file_name()?.to_str()?;
        if name.ends_with(".json") {
            Some(SpecFormat::Json)
        } else if name.ends_with(".yaml") {
            Some(SpecFormat::Yaml)
        } else {
            None
        }
    }
}

/// Decodes spec data strictly: an unknown field anywhere, a wrong type, or trailing garbage is
/// an error ([`SpecError::Parse`]). Does not validate the content; see [`load_spec`].
pub fn parse_spec(data: &[u8], format: SpecFormat) -> Result<Spec, SpecError> {
    let parsed = match format {
        SpecFormat::Json => serde_json::from_slice::<Spec>(data).map_err(|e| e.to_string()),
        SpecFormat::Yaml => {
            if data.iter().all(u8::is_ascii_whitespace) {
                // An empty YAML document decodes to nothing, which the reference loader
                // reports as "no Spec data".
                return Err(SpecError::Parse("no spec data".to_string()));
            }
            serde_norway::from_slice::<Spec>(data).map_err(|e| e.to_string())
        }
    };
    parsed.map_err(SpecError::Parse)
}

/// Decodes and validates spec data (see [`validate_spec`]).
pub fn load_spec(data: &[u8], format: SpecFormat) -> Result<Spec, SpecError> {
    let spec = parse_spec(data, format)?;
    validate_spec(&spec)?;
    Ok(spec)
}

/// Reads, decodes and validates one spec file; the format comes from the extension
/// (`.json` or `.yaml`, anything else is [`SpecError::Extension`]).
pub fn load_spec_file(path: &Path) -> Result<Spec, SpecError> {
    let format =
        SpecFormat::from_path(path).ok_or_else(|| SpecError::Extension(PathBuf::from(path)))?;
    let data = std::fs::read(path).map_err(|source| SpecError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    load_spec(&data, format)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD_JSON: &str = r#"{
        "cdiVersion": "0.3.0",
        "kind": "example.com/dev",
        "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]
    }"#;

    #[test]
    fn json_and_yaml_decode_to_the_same_spec() {
        let yaml = "---\ncdiVersion: 0.3.0\nkind: example.com/dev\ndevices:\n- name: a\n  containerEdits:\n    env: [\"A=1\"]\n";
        let a = load_spec(GOOD_JSON.as_bytes(), SpecFormat::Json).unwrap();
        let b = load_spec(yaml.as_bytes(), SpecFormat::Yaml).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.devices[0].container_edits.env, vec!["A=1"]);
    }

    #[test]
    fn unknown_fields_are_refused_at_every_level() {
        let cases = [
            r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"a","containerEdits":{"env":["A=1"]}}],"extra":1}"#,
            r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"a","extra":1,"containerEdits":{"env":["A=1"]}}]}"#,
            r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"a","containerEdits":{"env":["A=1"],"extra":1}}]}"#,
            r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"a","containerEdits":{"deviceNodes":[{"path":"/dev/x","mode":1}]}}]}"#,
            r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"a","containerEdits":{"mounts":[{"hostPath":"/a","containerPath":"/b","readonly":true}]}}]}"#,
            r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"a","containerEdits":{"hooks":[{"hookName":"prestart","path":"/x","name":"y"}]}}]}"#,
            r#"{"cdiVersion":"0.7.0","kind":"a.com/b","devices":[{"name":"a","containerEdits":{"intelRdt":{"closID":"x","foo":1}}}]}"#,
            r#"{"cdiVersion":"1.1.0","kind":"a.com/b","devices":[{"name":"a","containerEdits":{"netDevices":[{"hostInterfaceName":"e","name":"f","mac":"x"}]}}]}"#,
        ];
        for case in cases {
            let err = parse_spec(case.as_bytes(), SpecFormat::Json).unwrap_err();
            assert!(
                matches!(err, SpecError::Parse(ref m) if m.contains("unknown field")),
                "{case}: {err}"
            );
        }
        let yaml = "cdiVersion: 0.3.0\nkind: a.com/b\nfoo: bar\ndevices: []\n";
        let err = parse_spec(yaml.as_bytes(), SpecFormat::Yaml).unwrap_err();
        assert!(err.to_string().contains("unknown field `foo`"), "{err}");
    }

    #[test]
    fn nulls_read_as_zero_values() {
        let json = r#"{"cdiVersion":"0.3.0","kind":"a.com/b","annotations":null,"containerEdits":null,
            "devices":[{"name":"a","containerEdits":{"env":["A=1"],"mounts":null,"hooks":null}}]}"#;
        let spec = load_spec(json.as_bytes(), SpecFormat::Json).unwrap();
        assert!(spec.container_edits.is_empty());
    }

    #[test]
    fn wrong_types_and_garbage_are_parse_errors() {
        for case in [
            r#"{"cdiVersion":3,"kind":"a.com/b","devices":[]}"#,
            r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":{}}"#,
            r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[]} trailing"#,
            r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"a","containerEdits":{"deviceNodes":[{"path":"/x","major":1.5}]}}]}"#,
            "not json",
        ] {
            assert!(matches!(
                parse_spec(case.as_bytes(), SpecFormat::Json),
                Err(SpecError::Parse(_))
            ));
        }
        assert!(matches!(
            parse_spec(b"  \n", SpecFormat::Yaml),
            Err(SpecError::Parse(_))
        ));
        assert!(matches!(
            parse_spec(b"- a\n- b\n", SpecFormat::Yaml),
            Err(SpecError::Parse(_))
        ));
    }

    #[test]
    fn yaml_octal_file_modes() {
        let yaml = |mode: &str| {
            format!("cdiVersion: 0.3.0\nkind: a.com/b\ndevices:\n- name: x\n  containerEdits:\n    deviceNodes:\n    - path: /dev/x\n      fileMode: {mode}\n")
        };
        for (text, want) in [
            ("0666", 0o666),
            ("0o640", 0o640),
            ("438", 438),
            ("04755", 0o4755),
        ] {
            let spec = parse_spec(yaml(text).as_bytes(), SpecFormat::Yaml).unwrap();
            assert_eq!(
                spec.devices[0].container_edits.device_nodes[0].file_mode,
                Some(want),
                "{text}"
            );
        }
        for bad in ["0689", "rw", "-1", "08", "\"\""] {
            assert!(
                parse_spec(yaml(bad).as_bytes(), SpecFormat::Yaml).is_err(),
                "{bad}"
            );
        }
        let json = r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"x","containerEdits":{"deviceNodes":[{"path":"/dev/x","fileMode":420}]}}]}"#;
        let spec = parse_spec(json.as_bytes(), SpecFormat::Json).unwrap();
        assert_eq!(
            spec.devices[0].container_edits.device_nodes[0].file_mode,
            Some(0o644)
        );
    }

    #[test]
    fn a_name_that_is_only_the_suffix_is_a_spec_file() {
        assert_eq!(
            SpecFormat::from_path(Path::new("/d/.json")),
            Some(SpecFormat::Json)
        );
        assert_eq!(
            SpecFormat::from_path(Path::new("/d/.yaml")),
            Some(SpecFormat::Yaml)
        );
        assert_eq!(SpecFormat::from_path(Path::new("/d/a.yml")), None);
        assert_eq!(SpecFormat::from_path(Path::new("/d/json")), None);
    }

    #[test]
    fn file_loading_checks_the_extension() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("x.json");
        std::fs::write(&good, GOOD_JSON).unwrap();
        assert!(load_spec_file(&good).is_ok());
        let yml = dir.path().join("x.yml");
        std::fs::write(&yml, GOOD_JSON).unwrap();
        assert!(matches!(load_spec_file(&yml), Err(SpecError::Extension(_))));
        let missing = dir.path().join("missing.json");
        assert!(matches!(
            load_spec_file(&missing),
            Err(SpecError::Read { .. })
        ));
    }

    #[test]
    fn serializing_round_trips_and_omits_empty_fields() {
        let spec = load_spec(GOOD_JSON.as_bytes(), SpecFormat::Json).unwrap();
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(
            text,
            r#"{"cdiVersion":"0.3.0","kind":"example.com/dev","devices":[{"name":"a","containerEdits":{"env":["A=1"]}}]}"#
        );
        let back = load_spec(text.as_bytes(), SpecFormat::Json).unwrap();
        assert_eq!(back, spec);
    }
}

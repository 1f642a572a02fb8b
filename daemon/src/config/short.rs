//! The short parameter form of our users' own documents: opaque parameters without
//! `apiVersion` and `kind`, such as `{sharingMode: mps, mpsActiveThreadPercentage: 50}`.
//!
//! Fields (all decoded strictly; a field that does not fit the mode is refused, naming it):
//!
//! | field | modes | meaning |
//! |---|---|---|
//! | `sharingMode` | required | `mps`, `time-slicing`, `mig` or `exclusive` |
//! | `mpsActiveThreadPercentage` | `mps` | whole number 1–100 |
//! | `mpsPinnedDeviceMemoryLimit` | `mps` | Kubernetes quantity, whole MiB ≥ 1 (our extension) |
//! | `timeSlice` | `time-slicing` | `default`, `short`, `medium`, `long` (any case); default `default` |
//! | `replicas` | `mps`, `time-slicing` | whole number ≥ 1: most containers attached at once |
//! | `migProfile` | `mig` | MIG profile such as `3g.20gb` |

use gpushare_proto::TimeSliceInterval;

use super::nvidia::active_thread_percentage;
use super::quantity::limit_mib;
use super::value::{join, show_str, Obj};
use super::{ConfigError, MpsSettings, Sharing};

/// Every field of the short form.
const FIELDS: &[&str] = &[
    "sharingMode",
    "mpsActiveThreadPercentage",
    "mpsPinnedDeviceMemoryLimit",
    "timeSlice",
    "replicas",
    "migProfile",
];

/// The values of `sharingMode`.
const MODES: &str = "\"mps\", \"time-slicing\", \"mig\" or \"exclusive\"";

/// Decodes short-form parameters found at `params.path`. Every refusal is `InvalidConfig`.
pub fn parse_short(params: Obj<'_>) -> Result<Sharing, ConfigError> {
    params.deny_unknown(FIELDS, "short-form parameters")?;
    let Some(mode) = params.opt_str("sharingMode")? else {
        return Err(params.err(
            "sharingMode",
            format!("is required in short-form parameters (one of {MODES}; or give apiVersion and kind of an NVIDIA GpuConfig)"),
        ));
    };
    let allowed: &[&str] = match mode {
        "mps" => &[
            "mpsActiveThreadPercentage",
            "mpsPinnedDeviceMemoryLimit",
            "replicas",
        ],
        "time-slicing" => &["timeSlice", "replicas"],
        "mig" => &["migProfile"],
        "exclusive" => &[],
        other => {
            return Err(params.err(
                "sharingMode",
                format!(
                    "unknown sharing mode {} (expected {MODES})",
                    show_str(other)
                ),
            ))
        }
    };
    if let Some(field) = FIELDS
        .iter()
        .find(|f| **f != "sharingMode" && params.has(f) && !allowed.contains(f))
    {
        return Err(params.err(
            field,
            format!(
                "does not apply to sharingMode {} (fields of this mode: {})",
                show_str(mode),
                if allowed.is_empty() {
                    "none".to_owned()
                } else {
                    allowed.join(", ")
                }
            ),
        ));
    }
    Ok(match mode {
        "mps" => {
            let mut settings = MpsSettings {
                active_thread_percentage: active_thread_percentage(
                    params,
                    "mpsActiveThreadPercentage",
                )?,
                ..MpsSettings::default()
            };
            if let Some(v) = params.get("mpsPinnedDeviceMemoryLimit") {
                settings.default_pinned_limit_mib = Some(limit_mib(
                    v,
                    &join(params.path, "mpsPinnedDeviceMemoryLimit"),
                )?);
            }
            Sharing::Mps {
                settings,
                replicas: replicas(params)?,
            }
        }
        "time-slicing" => Sharing::TimeSlicing {
            interval: time_slice(params)?,
            replicas: replicas(params)?,
        },
        "mig" => Sharing::Mig {
            profile: mig_profile(params)?,
            mps: None,
        },
        _ => Sharing::Exclusive,
    })
}

/// `replicas`: a whole number ≥ 1.
fn replicas(params: Obj<'_>) -> Result<Option<u32>, ConfigError> {
    let Some(n) = params.opt_int("replicas")? else {
        return Ok(None);
    };
    match u32::try_from(n) {
        Ok(r) if r >= 1 => Ok(Some(r)),
        _ => Err(params.err(
            "replicas",
            format!("value {n} must be a whole number from 1 to {}", u32::MAX),
        )),
    }
}

/// `timeSlice`: NVIDIA's interval names in any case; `Default` when absent.
fn time_slice(params: Obj<'_>) -> Result<TimeSliceInterval, ConfigError> {
    let Some(raw) = params.opt_str("timeSlice")? else {
        return Ok(TimeSliceInterval::Default);
    };
    match raw.to_ascii_lowercase().as_str() {
        "default" => Ok(TimeSliceInterval::Default),
        "short" => Ok(TimeSliceInterval::Short),
        "medium" => Ok(TimeSliceInterval::Medium),
        "long" => Ok(TimeSliceInterval::Long),
        _ => Err(params.err(
            "timeSlice",
            format!(
                "unknown time slice {} (expected \"default\", \"short\", \"medium\" or \"long\")",
                show_str(raw)
            ),
        )),
    }
}

/// `migProfile`: a MIG profile name such as `3g.20gb`, `1g.10gb+me` or `1c.3g.20gb`.
fn mig_profile(params: Obj<'_>) -> Result<Option<String>, ConfigError> {
    let Some(raw) = params.opt_str("migProfile")? else {
        return Ok(None);
    };
    if is_mig_profile(raw) {
        Ok(Some(raw.to_owned()))
    } else {
        Err(params.err(
            "migProfile",
            format!(
                "{} is not a MIG profile name (expected a name such as \"3g.20gb\" or \"1g.10gb+me\")",
                show_str(raw)
            ),
        ))
    }
}

/// Whether `name` has the shape of a MIG profile: optional `<n>c.`, then `<n>g.<n>gb`, then
/// an optional `+suffix` (`+me`, `+gfx`, …).
pub(crate) fn is_mig_profile(name: &str) -> bool {
    fn digits(s: &str) -> (&str, &str) {
        let n = s.bytes().take_while(u8::is_ascii_digit).count();
        s.split_at(n)
    }
    let mut rest = name;
    let (n, after) = digits(rest);
    if let Some(after_c) = after.strip_prefix("c.") {
        if n.is_empty() {
            return false;
        }
        rest = after_c;
    }
    let (gi, after) = digits(rest);
    let Some(after) = after.strip_prefix("g.") else {
        return false;
    };
    let (mem, after) = digits(after);
    let Some(suffix) = after.strip_prefix("gb") else {
        return false;
    };
    let suffix_ok = suffix.is_empty()
        || suffix.strip_prefix('+').is_some_and(|s| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'+')
        });
    !gi.is_empty() && !mem.is_empty() && suffix_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_proto::ErrorCode;
    use serde_json::{json, Value};

    fn parse(v: Value) -> Result<Sharing, ConfigError> {
        parse_short(Obj::new(&v, "p", ErrorCode::InvalidConfig)?)
    }

    fn refused(v: Value, needles: &[&str]) {
        let err = parse(v.clone()).expect_err(&format!("{v} must be refused"));
        assert_eq!(err.code, ErrorCode::InvalidConfig, "{}", err.message);
        for n in needles {
            assert!(err.message.contains(n), "{:?} lacks {n:?}", err.message);
        }
    }

    #[test]
    fn modes() {
        assert_eq!(
            parse(json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 50})),
            Ok(Sharing::Mps {
                settings: MpsSettings {
                    active_thread_percentage: Some(50),
                    ..MpsSettings::default()
                },
                replicas: None
            })
        );
        assert_eq!(
            parse(
                json!({"sharingMode": "mps", "mpsPinnedDeviceMemoryLimit": "10M", "replicas": 2})
            ),
            Ok(Sharing::Mps {
                settings: MpsSettings {
                    default_pinned_limit_mib: Some(9),
                    ..MpsSettings::default()
                },
                replicas: Some(2)
            })
        );
        assert_eq!(
            parse(json!({"sharingMode": "time-slicing", "timeSlice": "default", "replicas": 4})),
            Ok(Sharing::TimeSlicing {
                interval: TimeSliceInterval::Default,
                replicas: Some(4)
            })
        );
        assert_eq!(
            parse(json!({"sharingMode": "time-slicing"})),
            Ok(Sharing::TimeSlicing {
                interval: TimeSliceInterval::Default,
                replicas: None
            })
        );
        for (raw, interval) in [
            ("Short", TimeSliceInterval::Short),
            ("MEDIUM", TimeSliceInterval::Medium),
            ("long", TimeSliceInterval::Long),
        ] {
            assert_eq!(
                parse(json!({"sharingMode": "time-slicing", "timeSlice": raw})),
                Ok(Sharing::TimeSlicing {
                    interval,
                    replicas: None
                })
            );
        }
        assert_eq!(
            parse(json!({"sharingMode": "mig", "migProfile": "3g.20gb"})),
            Ok(Sharing::Mig {
                profile: Some("3g.20gb".into()),
                mps: None
            })
        );
        assert_eq!(
            parse(json!({"sharingMode": "mig"})),
            Ok(Sharing::Mig {
                profile: None,
                mps: None
            })
        );
        assert_eq!(
            parse(json!({"sharingMode": "exclusive"})),
            Ok(Sharing::Exclusive)
        );
    }

    #[test]
    fn refusals_name_the_field() {
        refused(json!({}), &["p.sharingMode", "required"]);
        refused(json!({"sharingMode": "MPS"}), &["p.sharingMode", "\"MPS\""]);
        refused(
            json!({"sharingMode": "timeslicing"}),
            &["p.sharingMode", "\"timeslicing\""],
        );
        refused(
            json!({"sharingMode": 1}),
            &["p.sharingMode", "expected a string"],
        );
        refused(
            json!({"sharingMode": "mps", "shareMode": "x"}),
            &["p.shareMode", "unknown field"],
        );
        refused(
            json!({"sharingMode": "mps", "timeSlice": "short"}),
            &["p.timeSlice", "\"mps\""],
        );
        refused(
            json!({"sharingMode": "time-slicing", "mpsActiveThreadPercentage": 5}),
            &["p.mpsActiveThreadPercentage"],
        );
        refused(
            json!({"sharingMode": "mig", "replicas": 2}),
            &["p.replicas", "\"mig\""],
        );
        refused(
            json!({"sharingMode": "exclusive", "migProfile": "3g.20gb"}),
            &["p.migProfile", "none"],
        );
        refused(
            json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 0}),
            &["p.mpsActiveThreadPercentage", "(0, 100]"],
        );
        refused(
            json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 101}),
            &["p.mpsActiveThreadPercentage", "101"],
        );
        refused(
            json!({"sharingMode": "mps", "mpsActiveThreadPercentage": "50"}),
            &["p.mpsActiveThreadPercentage", "\"50\""],
        );
        refused(
            json!({"sharingMode": "mps", "mpsPinnedDeviceMemoryLimit": "100Ki"}),
            &["p.mpsPinnedDeviceMemoryLimit", "value set too low"],
        );
        refused(
            json!({"sharingMode": "mps", "replicas": 0}),
            &["p.replicas", "value 0"],
        );
        refused(
            json!({"sharingMode": "mps", "replicas": -3}),
            &["p.replicas", "value -3"],
        );
        refused(
            json!({"sharingMode": "mps", "replicas": 5000000000u64}),
            &["p.replicas", "5000000000"],
        );
        refused(
            json!({"sharingMode": "time-slicing", "timeSlice": "VeryLong"}),
            &["p.timeSlice", "\"VeryLong\""],
        );
        refused(
            json!({"sharingMode": "mig", "migProfile": "3g"}),
            &["p.migProfile", "\"3g\""],
        );
    }

    #[test]
    fn mig_profile_shapes() {
        for ok in [
            "3g.20gb",
            "1g.5gb",
            "7g.80gb",
            "1g.10gb+me",
            "1g.24gb+gfx",
            "1c.3g.20gb",
            "1g.12gb+me.all",
        ] {
            assert!(is_mig_profile(ok), "{ok}");
        }
        for bad in [
            "",
            "3g",
            "3g.20",
            "3g20gb",
            "g.20gb",
            "3g.gb",
            "3g.20gb+",
            "3g.20GB",
            "c.3g.20gb",
            "3g.20gb/x",
        ] {
            assert!(!is_mig_profile(bad), "{bad}");
        }
    }
}

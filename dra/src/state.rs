//! What the plugin knows about itself, shared by its tasks and shown in `/healthz` and the
//! metrics: kubelet's registration verdict, whether gpushared answers, and whether it can
//! generate the driver's CDI spec that every prepare needs.

use std::sync::Mutex;

/// kubelet's last word on our registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// kubelet has not called `NotifyRegistrationStatus` yet.
    Pending,
    /// kubelet registered us.
    Registered,
    /// kubelet refused us, with its error.
    Refused(String),
}

/// gpushared as last seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpushared {
    /// Not asked yet.
    Unknown,
    /// It answered `health`; its node name.
    Up {
        /// gpushared's node name.
        node_name: String,
        /// Why gpushared cannot generate the NVIDIA driver's CDI spec, while it cannot: every
        /// prepare fails meanwhile ([`driver_spec_error`]).
        driver_spec_error: Option<String>,
    },
    /// It did not answer; why.
    Down(String),
}

/// Shared state; every field behind its own lock, held only to copy or replace a value.
#[derive(Debug)]
pub struct State {
    registration: Mutex<Registration>,
    gpushared: Mutex<Gpushared>,
}

impl Default for State {
    fn default() -> Self {
        State {
            registration: Mutex::new(Registration::Pending),
            gpushared: Mutex::new(Gpushared::Unknown),
        }
    }
}

impl State {
    /// kubelet's last verdict.
    pub fn registration(&self) -> Registration {
        self.registration
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records kubelet's verdict.
    pub fn set_registration(&self, r: Registration) {
        *self
            .registration
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = r;
    }

    /// gpushared as last seen.
    pub fn gpushared(&self) -> Gpushared {
        self.gpushared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records how gpushared answered.
    pub fn set_gpushared(&self, g: Gpushared) {
        *self
            .gpushared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = g;
    }
}

/// What gpushared's `health` answer says of the NVIDIA driver's CDI spec: its error while it
/// cannot generate it. `None` when it can, when it has none to generate (`[cdi] driver_spec =
/// "none"`), and from a gpushared before the field.
pub fn driver_spec_error(health: &serde_json::Value) -> Option<String> {
    let spec = health.get("driver_spec").filter(|s| s.is_object())?;
    if spec.get("ok").and_then(serde_json::Value::as_bool) != Some(false) {
        return None;
    }
    Some(
        spec.get("error")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("not generated yet")
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_failing_driver_spec_is_read_from_health_and_nothing_else_is() {
        let failing = json!({"ready": true, "driver_spec": {"path": "p", "generator": "g",
            "ok": false, "error": "Driver/library version mismatch"}});
        assert_eq!(
            driver_spec_error(&failing).as_deref(),
            Some("Driver/library version mismatch")
        );
        let untried = json!({"driver_spec": {"path": "p", "generator": "g", "ok": false}});
        assert_eq!(
            driver_spec_error(&untried).as_deref(),
            Some("not generated yet")
        );
        for fine in [
            json!({"driver_spec": {"path": "p", "generator": "g", "ok": true}}),
            json!({"driver_spec": null}),
            json!({"ready": true}),
        ] {
            assert_eq!(driver_spec_error(&fine), None, "{fine}");
        }
    }
}

//! What the plugin knows about itself, shared by its tasks and shown in `/healthz` and the
//! metrics: kubelet's registration verdict and whether gpushared answers.

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

//! The skip-attach design (docs/design/skip-attach.md): whether a CSI volume goes through the
//! attach/detach controller and a VolumeAttachment, from its driver's
//! `CSIDriver.spec.attachRequired`.
//!
//! Two modes, chosen with `--skip-attach` on the controller and the node agent alike:
//! - `bypass-adc` (default, today's Kubernetes): a volume whose CSIDriver says
//!   `attachRequired: false` never enters the ADC: no VolumeAttachment, not in
//!   `node.status.volumesAttached`, and the kubelet does not wait for an attach.
//! - `through-adc` (the design as written in 2018): every CSI volume goes through the ADC; for
//!   `attachRequired: false` the attach is a no-op that still lists the volume in
//!   `volumesAttached`, and the kubelet waits for that, but no VolumeAttachment is made.
//!
//! In both, a driver with no CSIDriver object is attachable (the object is optional), and a
//! detach deletes any VolumeAttachment it finds even for a driver that is not attachable (one
//! made before the CSIDriver existed, or by an older controller).

use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::storage::v1::CSIDriver;

/// `--skip-attach`: how volumes of drivers with `attachRequired: false` are handled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SkipAttachMode {
    /// Today's Kubernetes: such volumes bypass the ADC entirely.
    #[default]
    BypassAdc,
    /// The skip-attach design as written in 2018: they go through the ADC as a no-op attach.
    ThroughAdc,
}

impl FromStr for SkipAttachMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bypass-adc" => Ok(Self::BypassAdc),
            "through-adc" => Ok(Self::ThroughAdc),
            other => Err(format!(
                "--skip-attach={other}: want bypass-adc (today's Kubernetes, the default) or through-adc (the skip-attach design as written in 2018, docs/design/skip-attach.md)"
            )),
        }
    }
}

impl fmt::Display for SkipAttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::BypassAdc => "bypass-adc",
            Self::ThroughAdc => "through-adc",
        })
    }
}

/// What the cluster says about a driver: its CSIDriver object, if there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverAttach {
    /// No CSIDriver object: attachable, as Kubernetes assumes.
    NoCsiDriver,
    /// A CSIDriver object with this `spec.attachRequired` (unset means true, as the API
    /// server defaults it).
    CsiDriver { attach_required: bool },
}

impl DriverAttach {
    /// From the driver's CSIDriver, if it exists.
    pub fn from_csidriver(driver: Option<&CSIDriver>) -> Self {
        match driver {
            None => Self::NoCsiDriver,
            Some(d) => Self::CsiDriver {
                attach_required: d.spec.attach_required.unwrap_or(true),
            },
        }
    }

    /// Whether attaching means a VolumeAttachment that an external attacher fulfils.
    pub fn attachable(self) -> bool {
        !matches!(
            self,
            Self::CsiDriver {
                attach_required: false
            }
        )
    }
}

/// How one CSI volume is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachPath {
    /// The ADC creates a VolumeAttachment and waits for the attacher; the kubelet waits for the
    /// volume in `volumesAttached` and for the VolumeAttachment's `status.attached`.
    VolumeAttachment,
    /// The ADC attaches with a no-op (no VolumeAttachment) and lists the volume in
    /// `volumesAttached`; the kubelet waits for that listing only.
    NoOpThroughAdc,
    /// Neither the ADC nor the kubelet attaches or waits.
    NotAttached,
}

impl AttachPath {
    /// Whether the attach/detach controller tracks the volume at all.
    pub fn adc_manages(self) -> bool {
        !matches!(self, Self::NotAttached)
    }

    /// Whether attaching creates a VolumeAttachment.
    pub fn creates_volume_attachment(self) -> bool {
        matches!(self, Self::VolumeAttachment)
    }
}

/// The path of a CSI volume whose driver is described by `driver`, in `mode`.
pub fn attach_path(mode: SkipAttachMode, driver: DriverAttach) -> AttachPath {
    match (driver.attachable(), mode) {
        (true, _) => AttachPath::VolumeAttachment,
        (false, SkipAttachMode::ThroughAdc) => AttachPath::NoOpThroughAdc,
        (false, SkipAttachMode::BypassAdc) => AttachPath::NotAttached,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::CSIDriverSpec;

    fn csidriver(attach_required: Option<bool>) -> CSIDriver {
        CSIDriver {
            spec: CSIDriverSpec {
                attach_required,
                ..CSIDriverSpec::default()
            },
            ..CSIDriver::default()
        }
    }

    /// The skip-attach matrix (attach path by CSIDriver, for both modes).
    #[test]
    fn the_matrix() {
        use AttachPath::*;
        use SkipAttachMode::*;
        let rows = [
            (None, BypassAdc, VolumeAttachment),
            (None, ThroughAdc, VolumeAttachment),
            (Some(csidriver(None)), BypassAdc, VolumeAttachment),
            (Some(csidriver(Some(true))), ThroughAdc, VolumeAttachment),
            (Some(csidriver(Some(false))), BypassAdc, NotAttached),
            (Some(csidriver(Some(false))), ThroughAdc, NoOpThroughAdc),
        ];
        for (driver, mode, want) in rows {
            let info = DriverAttach::from_csidriver(driver.as_ref());
            assert_eq!(attach_path(mode, info), want, "{info:?} in {mode}");
        }
        assert!(!NotAttached.adc_manages());
        assert!(NoOpThroughAdc.adc_manages() && !NoOpThroughAdc.creates_volume_attachment());
        assert!(VolumeAttachment.creates_volume_attachment());
    }

    #[test]
    fn mode_flag_values() {
        assert_eq!(SkipAttachMode::default(), SkipAttachMode::BypassAdc);
        for mode in [SkipAttachMode::BypassAdc, SkipAttachMode::ThroughAdc] {
            assert_eq!(mode.to_string().parse::<SkipAttachMode>(), Ok(mode));
        }
        let err = "seed".parse::<SkipAttachMode>().unwrap_err();
        assert!(
            err.contains("through-adc") && err.contains("docs/design/skip-attach.md"),
            "{err}"
        );
    }
}

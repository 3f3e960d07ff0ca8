//! The scenarios: which cluster each runs on (its `UpConfig`) and which class its claims use.

use std::path::Path;

use volume_plugins::SkipAttachMode;

use cluster::{Migration, UpConfig};

pub(crate) use crate::harness::cli::Named;

/// One measured situation, each on its own throw-away cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// `ebs-sc`: provisioned, attached by csi-attacher through ec2-sim, staged on a loop device.
    Ebs,
    /// `hostpath` with `attachRequired: true`: a VolumeAttachment per volume, fulfilled by the
    /// hostpath driver's ControllerPublish through a csi-attacher.
    HostpathAttach,
    /// `hostpath`, `attachRequired: false`, the skip-attach design as written in 2018
    /// (docs/design/skip-attach.md): a no-op attach in the ADC.
    HostpathThroughAdc,
    /// `hostpath`, `attachRequired: false`, today's Kubernetes: the ADC is not involved.
    HostpathBypassAdc,
    /// The in-tree `gp2` class (`kubernetes.io/aws-ebs`) with CSIMigrationAWS on everywhere.
    InTreeMigrated,
    /// Claims on an Immediate `ebs.csi.aws.com` class until Bound, no pods.
    Provisioning,
}

/// The StorageClass the provisioning scenario creates.
pub(crate) const IMMEDIATE_CLASS: &str = "bench-immediate";

impl Named for Scenario {
    const ALL: &'static [Self] = &[
        Scenario::Ebs,
        Scenario::HostpathAttach,
        Scenario::HostpathThroughAdc,
        Scenario::HostpathBypassAdc,
        Scenario::InTreeMigrated,
        Scenario::Provisioning,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Ebs => "ebs",
            Scenario::HostpathAttach => "hostpath-attach",
            Scenario::HostpathThroughAdc => "hostpath-through-adc",
            Scenario::HostpathBypassAdc => "hostpath-bypass-adc",
            Scenario::InTreeMigrated => "in-tree-migrated",
            Scenario::Provisioning => "provisioning",
        }
    }
}

impl Scenario {
    /// The claims' StorageClass.
    pub(crate) fn class(self) -> &'static str {
        match self {
            Scenario::Ebs => "ebs-sc",
            Scenario::HostpathAttach
            | Scenario::HostpathThroughAdc
            | Scenario::HostpathBypassAdc => "hostpath",
            Scenario::InTreeMigrated => "gp2",
            Scenario::Provisioning => IMMEDIATE_CLASS,
        }
    }

    /// Whether the scenario runs pods (all but provisioning).
    pub(crate) fn has_pods(self) -> bool {
        self != Scenario::Provisioning
    }

    /// The cluster this scenario runs on: `nodes` nodes in one zone (an EBS volume may then
    /// go to any node the scheduler picks), the audit record on, and room on the nodes for
    /// `pods` pods with a quarter to spare (the scheduler spreads them, but not evenly).
    pub(crate) fn up_config(
        self,
        nodes: usize,
        pods: usize,
        data_dir: &Path,
        timing: ec2_sim::Timing,
    ) -> UpConfig {
        let mut c = UpConfig::new(nodes, data_dir);
        c.max_pods = max_pods_for(nodes, pods);
        c.zones = 1;
        c.timing = timing;
        c.audit = true;
        c.port = Some(0);
        c.migration = Migration::default();
        c.skip_attach = match self {
            Scenario::HostpathThroughAdc => SkipAttachMode::ThroughAdc,
            _ => SkipAttachMode::BypassAdc,
        };
        c.hostpath_attach_required = self == Scenario::HostpathAttach;
        c
    }
}

/// Each node's --max-pods for `pods` pods on `nodes` nodes: the kubelet's 110, or more when
/// the pods would not fit, with 25% headroom.
fn max_pods_for(nodes: usize, pods: usize) -> u32 {
    let per_node = pods.div_ceil(nodes.max(1));
    let wanted = per_node + per_node / 4;
    u32::try_from(wanted)
        .unwrap_or(u32::MAX)
        .max(cluster::config::DEFAULT_MAX_PODS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names_parse_back() {
        use crate::harness::cli::parse;
        for s in Scenario::ALL {
            assert_eq!(parse::<Scenario>(s.name()).unwrap(), *s);
        }
        let e = parse::<Scenario>("nfs").unwrap_err();
        assert!(
            e.contains("hostpath-through-adc, hostpath-bypass-adc"),
            "{e}"
        );
    }

    #[test]
    fn each_scenario_gets_its_cluster() {
        let dir = Path::new("/var/tmp/b");
        let through = Scenario::HostpathThroughAdc.up_config(3, 20, dir, ec2_sim::Timing::Fast);
        assert_eq!(through.skip_attach, SkipAttachMode::ThroughAdc);
        assert!(through.audit && !through.hostpath_attach_required);
        let attach = Scenario::HostpathAttach.up_config(1, 20, dir, ec2_sim::Timing::Fast);
        assert!(attach.hostpath_attach_required);
        assert_eq!(attach.skip_attach, SkipAttachMode::BypassAdc);
        assert_eq!(attach.nodes, 1);
        assert_eq!(attach.max_pods, 110, "20 pods fit the kubelet's default");
        assert_eq!(attach.zones, 1);
    }

    #[test]
    fn nodes_get_room_for_the_pods() {
        assert_eq!(max_pods_for(10, 1000), 125);
        assert_eq!(max_pods_for(20, 5000), 312);
        assert_eq!(max_pods_for(3, 7), 110);
        let dir = Path::new("/var/tmp/b");
        let c = Scenario::HostpathBypassAdc.up_config(20, 5000, dir, ec2_sim::Timing::Fast);
        assert!(c.max_pods as usize * 20 >= 5000, "{}", c.max_pods);
    }
}

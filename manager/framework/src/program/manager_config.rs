//! The flags the operator renders, read back as a [`ManagerConfig`]: the binary's half of the
//! round trip that [`ManagerConfig::to_args`] starts.

use std::path::PathBuf;

use crds::controllers::ControllerSelection;

use super::flags::Flags;
use super::invalid;
use crate::config::{LeaderElectionSettings, LeaderMigrationSource, ManagerConfig, workers};
use crate::error::Error;
use crate::ownership::NodeOwnership;
use crate::status::StatusTarget;

impl Flags {
    /// The settings the operator renders ([`ManagerConfig`]), checked as at start-up. Empty
    /// `--controllers` entries are dropped, so `--controllers=` runs none.
    pub fn manager_config(&self) -> Result<ManagerConfig, Error> {
        let entries: Vec<&str> = self.controllers.iter().map(String::as_str).filter(|e| !e.trim().is_empty()).collect();
        let controllers = ControllerSelection::parse(&entries).map_err(|e| invalid("--controllers", e.to_string()))?;
        let config = ManagerConfig {
            provider: self.cloud_provider.clone(),
            cloud_config: Some(PathBuf::from(&self.cloud_config)).filter(|p| !p.as_os_str().is_empty()),
            controllers,
            cluster_name: self.cluster_name.clone(),
            cluster_cidr: Some(self.cluster_cidr.clone()).filter(|c| !c.trim().is_empty()),
            configure_cloud_routes: self.configure_cloud_routes,
            concurrent_node_syncs: workers("--concurrent-node-syncs", self.concurrent_node_syncs)?,
            concurrent_service_syncs: workers("--concurrent-service-syncs", self.concurrent_service_syncs)?,
            concurrent_route_syncs: workers("--concurrent-route-syncs", self.concurrent_route_syncs)?,
            leader_election: LeaderElectionSettings {
                enabled: self.leader_elect,
                namespace: self.leader_elect_resource_namespace.clone(),
                // Never the Lease of the manager being shadowed (docs/shadow.md).
                name: match self.leader_elect_resource_name.as_str() {
                    crds::defaults::LEASE_NAME if self.shadow => format!("{}-shadow", crds::defaults::LEASE_NAME),
                    name => name.to_string(),
                },
                lease_duration: self.leader_elect_lease_duration,
                renew_deadline: self.leader_elect_renew_deadline,
                retry_period: self.leader_elect_retry_period,
            },
            leader_migration: match (self.enable_leader_migration, self.leader_migration_config.as_str()) {
                (false, _) => None,
                (true, "") => Some(LeaderMigrationSource::Default),
                (true, path) => Some(LeaderMigrationSource::File(PathBuf::from(path))),
            },
            leader_migration_namespace: Some(self.leader_migration_lease_namespace.clone()).filter(|ns| !ns.is_empty()),
            load_balancer_class: Some(self.load_balancer_class.clone()).filter(|c| !c.is_empty()),
            handle_unclassed_services: self.handle_unclassed_services,
            secure_port: self.secure_port,
            ccm_resource: match self.ccm_resource.as_str() {
                "" => None,
                target => Some(target.parse::<StatusTarget>().map_err(|m| invalid("--ccm-resource", m))?),
            },
            extra_args: Vec::new(),
            shadow: self.shadow,
            orphan_sweep: self.orphan_sweep,
            node_ownership: NodeOwnership::of(&self.cloud_provider_platforms)
                .map_err(|m| invalid("--cloud-provider-platforms", m))?,
        };
        config.check()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    //! The round trip `ManagerConfig` → arguments → the binary's flag parser → `ManagerConfig`,
    //! over generated configurations that vary every field.

    use std::time::Duration;

    use super::*;
    use crate::leader_migration::LeaderMigrationConfiguration;
    use crds::controllers::Controller;

    /// A small deterministic generator (xorshift), so failures reproduce from the seed.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn bool(&mut self) -> bool {
            self.below(2) == 1
        }
        fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
            of[self.below(of.len() as u64) as usize]
        }
        fn duration(&mut self) -> Duration {
            match self.below(3) {
                0 => Duration::from_secs(1 + self.below(600)),
                1 => Duration::from_millis(1 + self.below(90_000)),
                _ => Duration::from_nanos(1 + self.below(5_000_000_000)),
            }
        }
    }

    fn controllers(g: &mut Gen) -> ControllerSelection {
        let mut entries = Vec::new();
        for _ in 0..g.below(5) {
            let c = Controller::ALL[g.below(4) as usize];
            let name = if g.bool() { c.name() } else { c.alias() };
            entries.push(match g.below(3) {
                0 => "*".to_string(),
                1 => format!("-{name}"),
                _ => name.to_string(),
            });
        }
        ControllerSelection::parse(&entries).expect("generated entries are known")
    }

    /// A valid `LeaderMigrationConfiguration` file, written once for the whole test binary.
    fn migration_file() -> PathBuf {
        static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        FILE.get_or_init(|| {
            let path = std::env::temp_dir().join(format!("ccm-leader-migration-{}.yaml", std::process::id()));
            let config = LeaderMigrationConfiguration {
                leader_name: "moving".into(),
                controller_leaders: vec![crate::leader_migration::ControllerLeader::new("service", "*")],
            };
            std::fs::write(&path, config.to_yaml()).expect("the temporary directory is writable");
            path
        })
        .clone()
    }

    fn config(g: &mut Gen) -> ManagerConfig {
        let mut config = config_acting(g);
        // Shadow mode with everything it allows (its own Lease, no migration).
        config.shadow =
            g.bool() && config.leader_migration.is_none() && config.leader_election.name != crds::defaults::LEASE_NAME;
        // A shadow manager never sweeps.
        config.orphan_sweep &= !config.shadow;
        config
    }

    fn config_acting(g: &mut Gen) -> ManagerConfig {
        let retry = g.duration();
        let renew = retry.mul_f64(1.2) + g.duration();
        let lease = renew + g.duration();
        let leader_elect = g.bool();
        let leader_migration = match g.below(3) {
            _ if !leader_elect => None,
            0 => None,
            1 => Some(LeaderMigrationSource::Default),
            _ => Some(LeaderMigrationSource::File(migration_file())),
        };
        let class = g.bool().then(|| g.pick(&["example.com/lb", "x"]).to_string());
        ManagerConfig {
            provider: g.pick(&["fake", "baremetal", "aws", "my-cloud"]).to_string(),
            cloud_config: g.bool().then(|| PathBuf::from(g.pick(&["/etc/ccm/cloud.conf", "/config/a b.yaml"]))),
            controllers: controllers(g),
            cluster_name: g.pick(&["kubernetes", "prod", "lab-1"]).to_string(),
            cluster_cidr: g
                .bool()
                .then(|| g.pick(&["10.244.0.0/16", "10.244.0.0/16,fd00::/48", "not-a-cidr"]).to_string()),
            configure_cloud_routes: g.bool(),
            concurrent_node_syncs: 1 + g.below(100) as usize,
            concurrent_service_syncs: 1 + g.below(100) as usize,
            concurrent_route_syncs: 1 + g.below(100) as usize,
            leader_election: LeaderElectionSettings {
                enabled: leader_elect,
                namespace: g.pick(&["kube-system", "ccm"]).to_string(),
                name: g.pick(&["cloud-controller-manager", "aws", "bm"]).to_string(),
                lease_duration: lease,
                renew_deadline: renew,
                retry_period: retry,
            },
            leader_migration_namespace: leader_migration
                .is_some()
                .then(|| g.pick(&["", "ccm-moving", "kube-system"]).to_string())
                .filter(|ns| !ns.is_empty()),
            leader_migration,
            load_balancer_class: class.clone(),
            handle_unclassed_services: class.is_some() && g.bool(),
            secure_port: g.pick(&["0", "10258", "443"]).parse().expect("a port"),
            ccm_resource: g.bool().then(|| StatusTarget { namespace: "kube-system".into(), name: "aws".into() }),
            extra_args: Vec::new(),
            shadow: false,
            orphan_sweep: g.bool(),
            node_ownership: match g.below(3) {
                0 => NodeOwnership::all(),
                1 => NodeOwnership::of(&["aws"]).expect("a platform"),
                _ => NodeOwnership::of(&["gce", "openstack"]).expect("platforms"),
            },
        }
    }

    fn read_back(args: &[String]) -> ManagerConfig {
        let flags = Flags::try_parse_args(std::iter::once("cloud-controller-manager".to_string()).chain(args.to_vec()))
            .unwrap_or_else(|e| panic!("{args:?} do not parse: {e}"));
        flags.manager_config().unwrap_or_else(|e| panic!("{args:?} are refused: {e}"))
    }

    #[test]
    fn a_manager_config_survives_the_flag_parser_for_every_field() {
        for seed in 1..=2_000u64 {
            let mut g = Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let config = config(&mut g);
            config.check().unwrap_or_else(|e| panic!("seed {seed}: generated config refused: {e}"));
            assert_eq!(read_back(&config.to_args()), config, "seed {seed}");
        }
    }

    #[test]
    fn the_default_config_renders_the_binarys_defaults() {
        assert_eq!(read_back(&[]), ManagerConfig::default());
        assert_eq!(read_back(&ManagerConfig::default().to_args()), ManagerConfig::default());
    }

    #[test]
    fn extra_args_come_last_and_reach_the_parser() {
        let config = ManagerConfig {
            provider: "fake".into(),
            extra_args: vec!["--kube-api-qps=5".into(), "--node-monitor-period=7s".into()],
            ..ManagerConfig::default()
        };
        let args = config.to_args();
        assert_eq!(args.last().map(String::as_str), Some("--node-monitor-period=7s"));
        let flags = Flags::try_parse_args(std::iter::once("ccm".to_string()).chain(args)).unwrap();
        assert_eq!((flags.node_monitor_period, flags.kube_api_qps), (Duration::from_secs(7), 5.0));
        assert_eq!(flags.manager_config().unwrap(), ManagerConfig { extra_args: Vec::new(), ..config });
    }
}

//! Prints a CRD as YAML: the CloudControllerManager CRD, with the argument `pool` the
//! LoadBalancerIPPool CRD, with `announcement` the ServiceAnnouncement CRD.

fn main() -> Result<(), crds::Error> {
    match std::env::args().nth(1).as_deref() {
        Some("pool") => print!("{}", crds::pool_crd_yaml()?),
        Some("announcement") => print!("{}", crds::announcement_crd_yaml()?),
        _ => print!("{}", crds::crd_yaml()?),
    }
    Ok(())
}

//! Prints a CRD as YAML: the CloudControllerManager CRD, or with the argument `pool` the
//! LoadBalancerIPPool CRD.

fn main() -> Result<(), crds::Error> {
    match std::env::args().nth(1).as_deref() {
        Some("pool") => print!("{}", crds::pool_crd_yaml()?),
        _ => print!("{}", crds::crd_yaml()?),
    }
    Ok(())
}

//! Prints the CloudControllerManager CRD as YAML.

fn main() -> Result<(), crds::Error> {
    print!("{}", crds::crd_yaml()?);
    Ok(())
}

//! `RoleARN`: credentials of an assumed role, asked for as upstream asks: every `AssumeRole`
//! carries `x-amz-source-account` (the role's account) and, with `SourceARN`, `x-amz-source-arn`,
//! signed with the request, so trust policies that guard against the confused deputy accept it.
//! And `SigningName` of a `[ServiceOverride]`, through an interceptor.

use aws_credential_types::Credentials;
use aws_credential_types::provider::{self, ProvideCredentials, error::CredentialsError, future};
use aws_sdk_ec2::config::interceptors::BeforeTransmitInterceptorContextMut;
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};

/// The headers upstream sends with `AssumeRole`.
pub fn assume_role_headers(account: &str, source_arn: &str) -> Vec<(&'static str, String)> {
    let mut h = vec![("x-amz-source-account", account.to_string())];
    if !source_arn.is_empty() {
        h.push(("x-amz-source-arn", source_arn.to_string()));
    }
    h
}

/// Credentials of `role_arn`, assumed with the base credentials of `sts`'s config.
#[derive(Debug, Clone)]
pub struct AssumedRole {
    sts: aws_sdk_sts::Client,
    role_arn: String,
    session_name: String,
    headers: Vec<(&'static str, String)>,
}

impl AssumedRole {
    /// A provider assuming `role_arn` through `sts`, sending `headers`.
    pub fn new(
        sts: aws_sdk_sts::Client,
        role_arn: &str,
        session_name: &str,
        headers: Vec<(&'static str, String)>,
    ) -> Self {
        Self { sts, role_arn: role_arn.into(), session_name: session_name.into(), headers }
    }

    async fn assume(&self) -> provider::Result {
        let headers = self.headers.clone();
        let out = self
            .sts
            .assume_role()
            .role_arn(&self.role_arn)
            .role_session_name(&self.session_name)
            .customize()
            .mutate_request(move |req| {
                // Added before signing, so they are signed, as upstream's build-step middleware.
                for (k, v) in &headers {
                    req.headers_mut().insert(*k, v.clone());
                }
            })
            .send()
            .await
            .map_err(|e| CredentialsError::provider_error(aws_sdk_sts::error::DisplayErrorContext(e).to_string()))?;
        let c = out.credentials().ok_or_else(|| CredentialsError::not_loaded("AssumeRole returned no credentials"))?;
        let expiry = std::time::SystemTime::try_from(*c.expiration())
            .map_err(|_| CredentialsError::unhandled("AssumeRole returned an unreadable expiry"))?;
        Ok(Credentials::new(
            c.access_key_id(),
            c.secret_access_key(),
            Some(c.session_token().to_string()),
            Some(expiry),
            "AssumeRole",
        ))
    }
}

impl ProvideCredentials for AssumedRole {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(self.assume())
    }
}

/// Signs a client's requests for another service name (`SigningName` of a `[ServiceOverride]`).
#[derive(Debug, Clone)]
pub struct SigningNameOverride(pub String);

impl Intercept for SigningNameOverride {
    fn name(&self) -> &'static str {
        "SigningNameOverride"
    }

    fn modify_before_signing(
        &self,
        _context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_ec2::error::BoxError> {
        cfg.interceptor_state().store_put(aws_types::SigningName::from(self.0.clone()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assume_role_sends_the_source_account_always_and_the_source_arn_when_set() {
        assert_eq!(assume_role_headers("123", ""), vec![("x-amz-source-account", "123".to_string())]);
        let h = assume_role_headers("123", "arn:aws:eks:us-east-1:123:cluster/c");
        assert_eq!(h[1], ("x-amz-source-arn", "arn:aws:eks:us-east-1:123:cluster/c".to_string()));
    }
}

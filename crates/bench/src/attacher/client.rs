//! The run's own kube client: unthrottled, with a User-Agent of its own so the API server's
//! audit can tell its writes from the attacher's.

use kube::Client;

use super::USER_AGENT;
use crate::Error;

pub(crate) fn load_client(api: &apiserver::RunningApiServer) -> Result<Client, Error> {
    client_with_agent(api, USER_AGENT)
}

/// An (admin) client for `api` that sends `user_agent`.
pub(crate) fn client_with_agent(
    api: &apiserver::RunningApiServer,
    user_agent: &str,
) -> Result<Client, Error> {
    apiserver::install_crypto_provider();
    let url = api.url();
    let mut config = api.kube_config()?;
    let agent = http::HeaderValue::from_str(user_agent)
        .map_err(|e| Error::Config(format!("user agent {user_agent:?}: {e}")))?;
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((http::header::USER_AGENT, agent));
    Client::try_from(config).map_err(|source| Error::Kube {
        op: format!("building a client for {url}"),
        source,
    })
}

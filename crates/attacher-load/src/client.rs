//! The run's own kube client: unthrottled, with a User-Agent of its own so the API server's
//! audit can tell its writes from the attacher's.

use kube::Client;

use crate::{Error, USER_AGENT};

pub(crate) fn load_client(url: &str) -> Result<Client, Error> {
    client_with_agent(url, USER_AGENT)
}

/// A client for `url` that sends `user_agent`.
pub(crate) fn client_with_agent(url: &str, user_agent: &str) -> Result<Client, Error> {
    apiserver::install_crypto_provider();
    let uri: http::Uri = url
        .parse()
        .map_err(|e| Error::Config(format!("API server URL {url:?}: {e}")))?;
    let mut config = kube::Config::new(uri);
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

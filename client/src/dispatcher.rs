//! Calls to the dispatcher: connecting, registering, and fetching epoch plans.

use std::sync::Arc;

use granary_proto::MAX_MESSAGE_BYTES;
use granary_proto::v1::dispatcher_client::DispatcherClient;
use granary_proto::v1::{GetEpochPlanRequest, RegisterClientRequest, RegisterClientResponse};
use granary_security::{Bearer, TlsMaterial};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::backoff::Backoff;
use crate::endpoint::{self, CALL_TIMEOUT};
use crate::error::ClientError;
use crate::plan::Plan;
use crate::session::Session;
use crate::task::TaskGuard;

/// A dispatcher connection, sending the trainer's token with each call.
pub(crate) type Dispatcher = DispatcherClient<InterceptedService<Channel, Bearer>>;

/// Connects to the dispatcher at `address` (over TLS with `tls`, presenting `token`), failing
/// fast when it is unreachable. The channel reconnects by itself afterwards.
pub(crate) async fn connect(
    address: &str,
    tls: Option<&TlsMaterial>,
    token: Option<&str>,
) -> Result<Dispatcher, ClientError> {
    let bearer = Bearer::new(token).map_err(|e| ClientError::InvalidOptions(e.to_string()))?;
    let endpoint = endpoint::endpoint(address, tls)?.timeout(CALL_TIMEOUT);
    let channel = endpoint::connect(&endpoint)
        .await
        .map_err(|reason| ClientError::Unreachable { address: address.to_owned(), reason })?;
    Ok(DispatcherClient::with_interceptor(channel, bearer).max_decoding_message_size(MAX_MESSAGE_BYTES))
}

/// Registers a consumer. `tls` says whether the client dials TLS: a plaintext client whose
/// first call breaks HTTP/2 is most likely talking to a TLS port, and is told so.
pub(crate) async fn register(
    dispatcher: &mut Dispatcher,
    address: &str,
    tls: bool,
    request: RegisterClientRequest,
) -> Result<RegisterClientResponse, ClientError> {
    dispatcher.register_client(request).await.map(tonic::Response::into_inner).map_err(|status| {
        if !tls && status.message().contains("protocol error") {
            return ClientError::Unreachable {
                address: address.to_owned(),
                reason: format!(
                    "RegisterClient: {}; the dispatcher likely serves TLS: give its CA certificate \
                     (GRANARY_TLS_CA, ClientOptions::tls, or tls_ca= in Python) and a token",
                    status.message()
                ),
            };
        }
        ClientError::from_status("RegisterClient", address, &status)
    })
}

/// The consumer's plan for `epoch`.
pub(crate) async fn fetch_plan(
    dispatcher: &mut Dispatcher,
    session: &Session,
    epoch: u32,
) -> Result<Plan, ClientError> {
    fetch_plan_from(dispatcher, session, epoch, 0).await
}

/// The consumer's plan for `epoch` from slot `from_slot` on (the rest of a partial plan).
pub(crate) async fn fetch_plan_from(
    dispatcher: &mut Dispatcher,
    session: &Session,
    epoch: u32,
    from_slot: u64,
) -> Result<Plan, ClientError> {
    let consumer = &session.consumer;
    let request = GetEpochPlanRequest {
        pipeline: consumer.pipeline.clone(),
        job: consumer.job.clone(),
        consumer_index: consumer.consumer_index,
        epoch,
        from_slot,
    };
    let plan = dispatcher
        .get_epoch_plan(request)
        .await
        .map_err(|status| ClientError::from_status("GetEpochPlan", &session.address, &status))?
        .into_inner();
    Plan::from_proto(epoch, plan)
}

/// A plan being fetched in the background, ahead of the epoch that needs it.
#[derive(Debug)]
pub(crate) struct PlanFetch {
    /// The epoch the plan is for.
    pub(crate) epoch: u32,
    /// The fetch, retried while the dispatcher is unreachable or restarting.
    pub(crate) task: TaskGuard<Result<Plan, ClientError>>,
}

impl PlanFetch {
    /// Starts fetching the plan for `epoch`.
    pub(crate) fn spawn(mut dispatcher: Dispatcher, session: Arc<Session>, epoch: u32) -> PlanFetch {
        let task = TaskGuard::spawn(async move {
            let mut backoff = Backoff::reconnect();
            loop {
                match fetch_plan(&mut dispatcher, &session, epoch).await {
                    Err(ClientError::Unreachable { reason, .. }) => {
                        tracing::debug!(epoch, %reason, "plan fetch failed, retrying");
                    }
                    Err(ClientError::Refused { code, message, .. }) if is_transient(code) => {
                        tracing::debug!(epoch, ?code, %message, "plan fetch failed, retrying");
                    }
                    result => return result,
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        });
        PlanFetch { epoch, task }
    }
}

/// Codes a dispatcher answers while it restarts or is overloaded: worth retrying.
pub(crate) fn is_transient(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::NotFound
            | Code::Unknown
            | Code::Cancelled
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Internal
    )
}

//! How options (and a resume position) become a `RegisterClient` request, and how the answer
//! is checked.

use granary_proto::v1::{RegisterClientRequest, RegisterClientResponse, ResumePoint, SlotRange};

use crate::error::ClientError;
use crate::mode::Mode;
use crate::options::ClientOptions;
use crate::ranges::SlotRanges;
use crate::session::Consumer;

/// A registration to send, and where delivery starts.
#[derive(Debug)]
pub(crate) struct Registration {
    /// The request.
    pub(crate) request: RegisterClientRequest,
    /// The epoch to start in.
    pub(crate) epoch: u32,
    /// Slots of that epoch already delivered.
    pub(crate) delivered: SlotRanges,
}

impl Registration {
    /// The registration for `options`. A resume position supplies the job, index, count and
    /// mode; an explicit job or index that contradicts it is an error.
    pub(crate) fn new(options: &ClientOptions) -> Result<Registration, ClientError> {
        if options.pipeline.trim().is_empty() {
            return Err(ClientError::InvalidOptions("no pipeline given".into()));
        }
        let image_plans = options.images()?.to_proto().into();
        let Some(position) = options.resume.as_ref() else {
            return Ok(Registration {
                request: RegisterClientRequest {
                    pipeline: options.pipeline.clone(),
                    job: options.job.clone().unwrap_or_default(),
                    mode: options.mode.to_proto().into(),
                    consumer_index: options.consumer_index,
                    num_consumers: options.num_consumers.max(1),
                    resume: None,
                    wants_data: true,
                    image_plans,
                },
                epoch: 0,
                delivered: SlotRanges::default(),
            });
        };
        position.validate()?;
        let conflict = |what: &str, given: String, saved: String| {
            ClientError::BadPosition(format!(
                "the options name {what} {given}, the position was taken as {saved}"
            ))
        };
        if position.pipeline != options.pipeline {
            return Err(conflict("pipeline", options.pipeline.clone(), position.pipeline.clone()));
        }
        if let Some(job) = options.job.as_ref()
            && *job != position.job
        {
            return Err(conflict("job", job.clone(), position.job.clone()));
        }
        if let Some(index) = options.consumer_index
            && index != position.consumer_index
        {
            return Err(conflict("consumer", index.to_string(), position.consumer_index.to_string()));
        }
        let delivered = position.delivered_slots()?;
        Ok(Registration {
            request: RegisterClientRequest {
                pipeline: position.pipeline.clone(),
                job: position.job.clone(),
                mode: position.mode.to_proto().into(),
                consumer_index: Some(position.consumer_index),
                num_consumers: position.num_consumers,
                resume: Some(ResumePoint {
                    epoch: position.epoch,
                    delivered: delivered
                        .ranges()
                        .iter()
                        .map(|&(start, end)| SlotRange { start, end })
                        .collect(),
                    plan_fingerprint: position.plan_fingerprint,
                }),
                wants_data: true,
                image_plans,
            },
            epoch: position.epoch,
            delivered,
        })
    }

    /// The consumer the dispatcher registered, checked against the request.
    pub(crate) fn consumer(&self, response: &RegisterClientResponse) -> Result<Consumer, ClientError> {
        let num_consumers = response.num_consumers.max(1);
        if response.consumer_index >= num_consumers {
            return Err(ClientError::Refused {
                call: "RegisterClient",
                code: tonic::Code::Internal,
                message: format!("assigned consumer {} of {num_consumers}", response.consumer_index),
            });
        }
        if self.request.resume.is_some() && Some(response.consumer_index) != self.request.consumer_index {
            return Err(ClientError::BadPosition(format!(
                "the dispatcher resumed consumer {} instead of {}",
                response.consumer_index,
                self.request.consumer_index.unwrap_or_default()
            )));
        }
        let job = if response.job.is_empty() {
            if self.request.job.is_empty() { self.request.pipeline.clone() } else { self.request.job.clone() }
        } else {
            response.job.clone()
        };
        let mode = if response.mode == 0 {
            Mode::from_proto(self.request.mode)
        } else {
            Mode::from_proto(response.mode)
        };
        Ok(Consumer {
            pipeline: self.request.pipeline.clone(),
            job,
            consumer_index: response.consumer_index,
            num_consumers,
            mode,
            plan_fingerprint: response.plan_fingerprint,
            image_plans: self.request.image_plans,
        })
    }
}

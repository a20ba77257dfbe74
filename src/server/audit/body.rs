//! A body that passes its frames through unchanged, keeps a copy of them (up to a limit) when asked, and reports
//! once when it ends or is dropped: how the audit filter sees a request body as the handler reads it, and a response
//! body as it is sent, without buffering either.

use axum::body::Body;
use bytes::Bytes;
use hyper::body::{Body as _, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// What was read: the copy, or None when none was asked for or it went past the limit.
pub type OnEnd = Box<dyn FnOnce(Option<Vec<u8>>) + Send>;

pub struct ObservedBody {
    inner: Body,
    copy: Option<Vec<u8>>,
    limit: usize,
    on_end: Option<OnEnd>,
}

impl ObservedBody {
    pub fn wrap(inner: Body, copy: bool, limit: usize, on_end: OnEnd) -> Body {
        Body::new(ObservedBody { inner, copy: copy.then(Vec::new), limit, on_end: Some(on_end) })
    }

    fn end(&mut self) {
        if let Some(f) = self.on_end.take() {
            f(self.copy.take());
        }
    }
}

impl hyper::body::Body for ObservedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(copy)) = (frame.data_ref(), this.copy.as_mut()) {
                    if copy.len() + data.len() <= this.limit {
                        copy.extend_from_slice(data);
                    } else {
                        this.copy = None;
                    }
                }
            }
            Poll::Ready(None) => this.end(),
            Poll::Ready(Some(Err(_))) => this.copy = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ObservedBody {
    /// A body not read to its end (a client gone, a handler that stopped reading) still reports.
    fn drop(&mut self) {
        if self.copy.is_some() && !self.inner.is_end_stream() {
            self.copy = None;
        }
        self.end();
    }
}

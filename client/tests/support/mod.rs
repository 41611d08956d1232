//! A fake dispatcher and fake workers on loopback, in process, to drive the client.

#![allow(dead_code)]

pub mod dispatcher;
pub mod worker;

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// A listener on a free loopback port.
pub async fn listen() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    (listener, address)
}

/// The listener as a stream of connections for tonic.
pub fn incoming(listener: TcpListener) -> TcpListenerStream {
    TcpListenerStream::new(listener)
}

//! The tokio driver's sends that wait under the `block` policy, over real sockets on
//! loopback: the `Sink` loses nothing to a slow reader, `send_async` waits for pool room that
//! another connection's chunks free (without spinning), and a waiter whose connection closes
//! hears `Closed` and leaves nothing registered. Each test is bounded by a timeout and talks
//! only to 127.0.0.1.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage, WebSocket, WsConfig};
use freeboard::{Limit, PushOutcome, SendOutcome, SlowConsumerPolicy, Watermarks};
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message as TMessage;

/// A bound on every test: a hang fails instead of stalling CI.
const BOUND: Duration = Duration::from_secs(20);

/// The kernel's buffers on both sides of a connection, kept small so that a peer that does
/// not read soon leaves the bytes in freeboard's queue.
const SOCKET_BUFFER: u32 = 4096;

type Client = tokio_tungstenite::WebSocketStream<TcpStream>;

/// One connection with small socket buffers: freeboard's server side, accepted with
/// `config`, and a tungstenite client.
async fn connect(endpoint: &Arc<Endpoint>, config: &WsConfig) -> (WebSocket<TcpStream>, Client) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = async {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(SOCKET_BUFFER).unwrap();
        let stream = socket.connect(addr).await.unwrap();
        let (client, _) =
            tokio_tungstenite::client_async(format!("ws://{addr}/"), stream).await.unwrap();
        client
    };
    let server = async {
        let (stream, _) = listener.accept().await.unwrap();
        socket2::SockRef::from(&stream).set_send_buffer_size(SOCKET_BUFFER as usize).unwrap();
        WebSocket::accept(stream, endpoint, config).await.unwrap()
    };
    let (client, server) = tokio::join!(client, server);
    (server, client)
}

/// Message `i`: its number, then filler up to a size that cycles up to 14 KiB, so that some
/// messages do not fit between the low watermark and the cap.
fn numbered(i: u32) -> Vec<u8> {
    let len = 4 + (i as usize * 3701) % (14 << 10);
    let mut bytes = vec![(i % 251) as u8; len];
    bytes[..4].copy_from_slice(&i.to_be_bytes());
    bytes
}

/// Counts the polls of a future.
struct Counted<F> {
    inner: Pin<Box<F>>,
    polls: Arc<AtomicUsize>,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, task: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll(task)
    }
}

/// A connection that fills `endpoint`'s pool: its client never reads, and its queue (with
/// watermarks far above the pool, so it is never behind) takes messages until the `block`
/// policy refuses one for want of pool room.
async fn hog(endpoint: &Arc<Endpoint>) -> (WebSocket<TcpStream>, Client) {
    let marks = Watermarks::new(16 << 20, 32 << 20, 64 << 20).unwrap();
    let config = WsConfig::default().watermarks(marks).slow_consumer(SlowConsumerPolicy::Block);
    let (hog, client) = connect(endpoint, &config).await;
    let refused = (0..10_000).map(|_| hog.send_binary(&[3u8; 4000])).find(|outcome| {
        *outcome == SendOutcome::Queue(PushOutcome::WouldBlock { limit: Limit::Pool })
    });
    assert!(refused.is_some(), "the hog filled the pool");
    (hog, client)
}

/// A small endpoint (about 100 chunks of 4 KiB) whose connections need little to open.
fn small_endpoint() -> Arc<Endpoint> {
    let config = EndpointConfig::default().memory(512 << 10).connection_reserve(4096);
    Endpoint::new(config).expect("a valid endpoint")
}

/// Until `endpoint` has `n` connections waiting for pool room.
async fn waiting_for_room(endpoint: &Endpoint, n: usize) {
    while endpoint.connections_waiting_for_room() != n {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn the_sink_delivers_every_message_in_order_to_a_slow_reader_under_block() {
    tokio::time::timeout(BOUND, async {
        const COUNT: u32 = 300;
        let endpoint = Endpoint::new(EndpointConfig::default()).unwrap();
        // A message of up to 14 KiB sent once the queue is writable (4 KiB or less) can pass
        // the 16 KiB cap: the `block` policy refuses it, and the Sink must keep it.
        let marks = Watermarks::new(4 << 10, 8 << 10, 16 << 10).unwrap();
        let config = WsConfig::default().watermarks(marks).slow_consumer(SlowConsumerPolicy::Block);
        let (ws, mut client) = connect(&endpoint, &config).await;
        let server = tokio::spawn(async move {
            let (_reader, mut writer) = ws.split();
            for i in 0..20 {
                SinkExt::send(&mut writer, OwnedMessage::Binary(numbered(i))).await.unwrap();
            }
            let rest = (20..COUNT).map(|i| Ok(OwnedMessage::Binary(numbered(i))));
            writer.send_all(&mut futures_util::stream::iter(rest)).await.unwrap();
            SinkExt::close(&mut writer).await.unwrap();
        });
        let mut received = 0;
        while let Some(Ok(message)) = client.next().await {
            match message {
                TMessage::Binary(bytes) => {
                    assert_eq!(&bytes[..], &numbered(received)[..], "message {received}");
                    received += 1;
                    if received % 10 == 0 {
                        // A slow reader: the queue fills while it sleeps.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
                TMessage::Close(_) => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        server.await.unwrap();
        assert_eq!(received, COUNT, "every message arrived, in order");
        let refused = endpoint.counters().would_block;
        assert!(refused > 0, "the block policy refused messages the Sink then kept");
        assert_eq!(endpoint.connections_waiting_for_room(), 0);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn send_async_waits_for_the_pool_room_another_connections_chunks_free() {
    tokio::time::timeout(BOUND, async {
        let endpoint = small_endpoint();
        let config = WsConfig::default().slow_consumer(SlowConsumerPolicy::Block);
        let (sender, mut sender_client) = connect(&endpoint, &config).await;
        let (hog, mut hog_client) = hog(&endpoint).await;
        let message = vec![9u8; 16 << 10];
        assert_eq!(
            sender.send_binary(&message),
            SendOutcome::Queue(PushOutcome::WouldBlock { limit: Limit::Pool }),
            "the pool is too short for the message"
        );

        let polls = Arc::new(AtomicUsize::new(0));
        let send = Counted {
            inner: Box::pin({
                let message = message.clone();
                async move { (sender.send_async(OwnedMessage::Binary(message)).await, sender) }
            }),
            polls: Arc::clone(&polls),
        };
        let send = tokio::spawn(send);
        waiting_for_room(&endpoint, 1).await;
        // Nothing comes back to the pool while the hog's client does not read: the waiter
        // is not polled again (a retry loop would spin here).
        let before = polls.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(polls.load(Ordering::Relaxed), before, "the waiter sleeps");
        assert!(!send.is_finished());

        // The hog's client reads, and its queue drains: its chunks go back to the pool.
        let drain = tokio::spawn(async move {
            let reading = async { while let Some(Ok(_)) = hog_client.next().await {} };
            tokio::select! {
                () = reading => {}
                () = hog.flush() => {}
            }
            (hog, hog_client)
        });
        let (outcome, sender) = send.await.unwrap();
        assert!(
            matches!(
                outcome,
                SendOutcome::Queue(PushOutcome::Queued | PushOutcome::QueuedAboveHigh)
            ),
            "{outcome:?}"
        );
        let polls = polls.load(Ordering::Relaxed);
        // Woken once the pool has room for the message: a couple of polls, bounded generously.
        assert!(polls <= 20, "woken when chunks came back, not spinning: {polls} polls");
        assert_eq!(endpoint.connections_waiting_for_room(), 0, "nothing left registered");
        let ((), received) = tokio::join!(sender.flush(), sender_client.next());
        match received {
            Some(Ok(TMessage::Binary(bytes))) => assert_eq!(&bytes[..], &message[..]),
            other => panic!("expected the message, got {other:?}"),
        }
        drop(drain.await.unwrap());
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_waiter_whose_connection_closes_hears_closed_and_leaves_nothing_registered() {
    tokio::time::timeout(BOUND, async {
        let endpoint = small_endpoint();
        let config = WsConfig::default().slow_consumer(SlowConsumerPolicy::Block);
        let (sender, mut sender_client) = connect(&endpoint, &config).await;
        let (_hog, _hog_client) = hog(&endpoint).await;
        let (mut reader, writer) = sender.split();
        let message = || OwnedMessage::Binary(vec![9u8; 16 << 10]);

        // A send given up before it is done leaves nothing registered.
        let mut abandoned = Box::pin(writer.send_async(message()));
        let first = std::future::poll_fn(|task| Poll::Ready(abandoned.as_mut().poll(task))).await;
        assert!(first.is_pending());
        assert_eq!(endpoint.connections_waiting_for_room(), 1);
        drop(abandoned);
        assert_eq!(endpoint.connections_waiting_for_room(), 0, "a dropped waiter leaves");

        let send = tokio::spawn({
            let writer = writer.clone();
            async move { writer.send_async(message()).await }
        });
        waiting_for_room(&endpoint, 1).await;
        // The peer closes; the reader hears it, and the waiting send with it.
        sender_client.close(None).await.unwrap();
        let read = tokio::spawn(async move { while reader.next().await.is_some() {} });
        assert_eq!(send.await.unwrap(), SendOutcome::Closed);
        assert_eq!(endpoint.connections_waiting_for_room(), 0, "the closed waiter leaves");
        read.await.unwrap();
        // Its Sink has nothing held, and says the connection is closed.
        let mut writer = writer;
        assert_eq!(
            SinkExt::send(&mut writer, message()).await,
            Err(freeboard::tokio::Error::Closed)
        );
    })
    .await
    .unwrap();
}

//! Pub/sub inside tokio over real sockets on loopback: a task publishes to an endpoint's
//! topics, connections subscribe; one frame per publication, shared by every subscriber; a
//! subscriber that does not read loses messages under its own policy (counted) while the
//! others get everything in order; subscriptions go with their connection. Each test is
//! bounded by a timeout and talks only to 127.0.0.1.

use std::sync::Arc;
use std::time::Duration;

use freeboard::tokio::{Endpoint, EndpointConfig, Reach, SubscribeError, WebSocket, WsConfig};
use freeboard::{MessageKind, SlowConsumerPolicy, Watermarks};
use futures_util::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message as TMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const BOUND: Duration = Duration::from_secs(30);

type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

fn endpoint(config: EndpointConfig) -> Arc<Endpoint> {
    Endpoint::new(config).expect("a valid endpoint")
}

/// Serves `configs.len()` connections on a fresh listener, each subscribed to `topic` with
/// its own send queue settings and read until it ends; returns the clients, connected in
/// order, once every subscription is in place.
async fn subscribers(
    endpoint: &Arc<Endpoint>,
    topic: &'static str,
    configs: Vec<WsConfig>,
) -> (Vec<Client>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    let n = configs.len();
    let server = {
        let endpoint = Arc::clone(endpoint);
        tokio::spawn(async move {
            for config in configs {
                let (stream, _) = listener.accept().await.unwrap();
                let mut ws = WebSocket::accept(stream, &endpoint, &config).await.unwrap();
                assert_eq!(ws.subscribe(topic), Ok(true));
                assert_eq!(ws.subscribe(topic), Ok(false), "already subscribed");
                tokio::spawn(async move { while ws.next().await.is_some() {} });
            }
        })
    };
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(tokio_tungstenite::connect_async(&url).await.unwrap().0);
    }
    while endpoint.subscribers(topic) < n {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (clients, server)
}

async fn wait_for(mut done: impl FnMut() -> bool) {
    while !done() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn a_task_publishes_to_every_subscriber_in_order_from_one_frame() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let n = 8;
        let (mut clients, _server) =
            subscribers(&endpoint, "scores", vec![WsConfig::default(); n]).await;
        assert_eq!(
            endpoint.publish("nobody", MessageKind::Text, b"x"),
            Reach::default(),
            "no subscriber: nothing framed"
        );
        assert_eq!(endpoint.counters().chunks_high_water, 0, "no pool memory for it");

        // 40 KiB: ten chunks framed once; eight copies would need eighty.
        let big: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        let reach = endpoint.publish("scores", MessageKind::Binary, &big);
        assert_eq!(reach, Reach { delivered: n as u64, dropped: 0 });
        let high = endpoint.counters().chunks_high_water;
        assert!((10..=12).contains(&high), "one frame shared by reference: {high} chunks");
        for i in 0..100 {
            let reach = endpoint.publish("scores", MessageKind::Text, format!("{i}").as_bytes());
            assert_eq!(reach.delivered, n as u64);
        }
        for client in &mut clients {
            assert_eq!(client.next().await.unwrap().unwrap(), TMessage::binary(big.clone()));
            for i in 0..100 {
                assert_eq!(client.next().await.unwrap().unwrap(), TMessage::text(format!("{i}")));
            }
        }
        wait_for(|| endpoint.counters().chunks_in_use == 0).await;

        // The subscriptions go with their connections.
        drop(clients);
        wait_for(|| endpoint.subscribers("scores") == 0 && endpoint.connections() == 0).await;
        assert_eq!(endpoint.publish("scores", MessageKind::Text, b"late"), Reach::default());
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_subscriber_that_never_reads_loses_messages_by_its_policy_and_delays_nobody() {
    tokio::time::timeout(BOUND, async {
        let marks = Watermarks::new(16 << 10, 64 << 10, 256 << 10).unwrap();
        for policy in [SlowConsumerPolicy::DropOldest, SlowConsumerPolicy::Block] {
            let endpoint = endpoint(EndpointConfig::default().memory(16 << 20));
            let slow = WsConfig::default().watermarks(marks).slow_consumer(policy);
            let (mut clients, _server) =
                subscribers(&endpoint, "feed", vec![WsConfig::default(), slow]).await;
            let mut fast = clients.remove(0);
            let mut slow_client = clients.remove(0); // not read until every publish is done
            let reader = tokio::spawn(async move {
                let mut got = 0u32;
                while got < 400 {
                    match fast.next().await {
                        Some(Ok(TMessage::Binary(bytes))) => {
                            assert_eq!(&bytes[..4], &got.to_be_bytes(), "in order, none lost");
                            got += 1;
                        }
                        other => panic!("{other:?}"),
                    }
                }
                got
            });
            let mut total = Reach::default();
            let mut payload = vec![0u8; 32 << 10];
            for i in 0..400u32 {
                payload[..4].copy_from_slice(&i.to_be_bytes());
                total += endpoint.publish("feed", MessageKind::Binary, &payload);
                assert!(endpoint.counters().chunks_in_use * 4096 <= (256 << 10) + (2 << 20));
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            assert_eq!(reader.await.unwrap(), 400, "{policy:?}: the fast one got everything");
            assert_eq!(total.delivered + total.dropped, 800, "{policy:?}: each counted once");
            // 12.8 MB cannot all go into the slow one's socket buffers and a 256 KiB cap.
            let mut last = None;
            let mut got = 0;
            while let Ok(Some(Ok(TMessage::Binary(bytes)))) =
                tokio::time::timeout(Duration::from_millis(500), slow_client.next()).await
            {
                last = Some(u32::from_be_bytes(bytes[..4].try_into().unwrap()));
                got += 1;
            }
            assert!(got < 400, "{policy:?}: the slow one lost some ({got})");
            match policy {
                // The newest messages are kept, the older ones went.
                SlowConsumerPolicy::DropOldest => assert_eq!(last, Some(399)),
                // Refused while the queue was full: each refusal is a drop for it.
                _ => assert_eq!(total.dropped, 400 - got, "{policy:?}: {total:?}"),
            }
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn unsubscribe_and_limits_and_clients_are_refused_with_their_reason() {
    tokio::time::timeout(BOUND, async {
        let mut config = EndpointConfig::default();
        config.max_topics_per_connection = 2;
        let endpoint = endpoint(config);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = {
            let endpoint = Arc::clone(&endpoint);
            tokio::spawn(async move {
                let (stream, _) = listener.accept().await.unwrap();
                WebSocket::accept(stream, &endpoint, &WsConfig::default()).await.unwrap()
            })
        };
        let (client, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/")).await.unwrap();
        let ws = server.await.unwrap();
        assert_eq!(ws.subscribe("bad name"), Err(SubscribeError::InvalidName));
        assert_eq!(ws.subscribe("a"), Ok(true));
        assert_eq!(ws.subscribe("b"), Ok(true));
        assert_eq!(ws.subscribe("c"), Err(SubscribeError::TooManyTopics));
        assert_eq!(ws.topics(), ["a", "b"]);
        assert!(ws.unsubscribe("a"));
        assert!(!ws.unsubscribe("a"), "no longer subscribed");
        assert_eq!(endpoint.subscribers("a"), 0);
        assert_eq!(endpoint.publish("a", MessageKind::Text, b"x"), Reach::default());

        // A client connection of the driver: its frames must be masked, a shared frame is not
        // (refused before any byte moves, so the socket's far end needs no handshake).
        let far = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let io = TcpStream::connect(far.local_addr().unwrap()).await.unwrap();
        let as_client = WebSocket::client_from_upgraded(io, &endpoint, &WsConfig::default(), None);
        assert_eq!(as_client.subscribe("a"), Err(SubscribeError::ClientConnection));
        drop((client, ws, as_client));
        wait_for(|| endpoint.connections() == 0).await;
        assert_eq!(endpoint.subscribers("b"), 0, "the subscription went with its connection");
    })
    .await
    .unwrap();
}

/// The broadcast room of the axum example: each member subscribes to the endpoint's topic and
/// publishes what it receives.
async fn room(ws: freeboard::tokio::axum::WebSocketUpgrade) -> axum::response::Response {
    ws.on_upgrade(|mut socket: freeboard::tokio::axum::AxumWebSocket| async move {
        socket.subscribe("room").unwrap();
        while let Some(message) = socket.next().await {
            let Some((kind, data)) = message.as_data() else { break };
            socket.endpoint().publish("room", kind, data);
        }
    })
}

#[tokio::test]
async fn an_axum_room_hands_every_message_to_every_member() {
    use futures_util::SinkExt;
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let app = axum::Router::new()
            .route("/room", axum::routing::get(room))
            .layer(axum::Extension(Arc::clone(&endpoint)));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/room", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let mut members = Vec::new();
        for _ in 0..3 {
            members.push(tokio_tungstenite::connect_async(&url).await.unwrap().0);
        }
        wait_for(|| endpoint.subscribers("room") == 3).await;
        for (i, member) in members.iter_mut().enumerate() {
            member.send(TMessage::text(format!("from {i}"))).await.unwrap();
        }
        for member in &mut members {
            let mut heard = Vec::new();
            for _ in 0..3 {
                heard.push(member.next().await.unwrap().unwrap().into_text().unwrap().to_string());
            }
            heard.sort();
            assert_eq!(heard, ["from 0", "from 1", "from 2"]);
        }
        drop(members);
        wait_for(|| endpoint.subscribers("room") == 0).await;
        wait_for(|| endpoint.counters().chunks_in_use == 0).await;
    })
    .await
    .unwrap();
}

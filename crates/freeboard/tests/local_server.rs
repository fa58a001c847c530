//! A `LocalServer` driven from the test's thread as a host event loop would drive it: wait
//! for its descriptor with `poll(2)`, turn, act between turns, flush. Clients are blocking
//! sockets on threads of their own.

mod common;

use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{Client, config};
use freeboard::{
    CloseCode, Conn, ConnKey, Handler, LocalServer, Message, MessageKind, PushOutcome, Router,
    SendOutcome, Server, Watermarks,
};

/// What the handler saw, in order: it only records (a host's handler hands events to its
/// language and acts between turns).
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Open(ConnKey),
    Message(ConnKey, Vec<u8>),
    Writable(ConnKey),
    Close(u16),
}

/// Shares its record with the test through an `Rc`: the router of a local server lives on
/// the caller's thread, so its handlers need not be `Send`.
struct Recorder(Rc<RefCell<Vec<Seen>>>);

impl Handler for Recorder {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        if conn.target().ends_with("?subscribe") {
            conn.subscribe("news").unwrap();
        }
        self.0.borrow_mut().push(Seen::Open(conn.key()));
    }
    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        self.0.borrow_mut().push(Seen::Message(conn.key(), message.data.to_vec()));
    }
    fn on_writable(&mut self, conn: &mut Conn<'_>) {
        self.0.borrow_mut().push(Seen::Writable(conn.key()));
    }
    fn on_close(&mut self, _: freeboard::ConnId, code: CloseCode, _: &str) {
        self.0.borrow_mut().push(Seen::Close(code.0));
    }
}

fn bind(seen: &Rc<RefCell<Vec<Seen>>>) -> LocalServer {
    let router = Router::new().route("/", Recorder(seen.clone()));
    Server::bind_local(config(), router).unwrap()
}

/// Waits for the server's descriptor (at most its timeout, at most 50 ms) and turns, until
/// `done` holds; fails after 10 s.
fn drive_until(server: &mut LocalServer, mut done: impl FnMut(&mut LocalServer) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(server) {
        assert!(Instant::now() < deadline, "timed out");
        let wait = server.timeout().map_or(50, |t| t.as_millis().min(50) as i32);
        let mut fd = libc::pollfd { fd: server.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, for the duration of the call.
        unsafe { libc::poll(&mut fd, 1, wait) };
        server.turn(Some(Duration::ZERO)).unwrap();
    }
}

fn client(addr: std::net::SocketAddr, f: impl FnOnce(Client) + Send + 'static) -> JoinHandle<()> {
    std::thread::spawn(move || f(Client::open(addr)))
}

#[test]
fn replies_sent_between_turns_carry_the_sessions_outcome() {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let mut server = bind(&seen);
    let peer = client(server.local_addr(), |mut c| {
        c.send(0x81, b"hello");
        assert_eq!(c.recv(), Some((0x1, b"HELLO".to_vec())));
        c.send(0x88, &1000u16.to_be_bytes());
        assert_eq!(c.recv_close(), Some(1000));
    });
    let mut replied = None;
    drive_until(&mut server, |server| {
        for event in seen.borrow_mut().drain(..) {
            if let Seen::Message(key, data) = event {
                let upper = data.to_ascii_uppercase();
                let outcome = server.with_conn(key, |c| c.send(MessageKind::Text, &upper));
                assert_eq!(outcome, Some(SendOutcome::Queue(PushOutcome::Queued)));
                replied = Some(key);
                server.flush();
            }
        }
        peer.is_finished()
    });
    peer.join().unwrap();
    // The connection has gone: its key finds nothing, and a late send says so.
    let key = replied.expect("a message was seen");
    drive_until(&mut server, |server| server.with_conn(key, |_| ()).is_none());
    assert!(seen.borrow().contains(&Seen::Close(1000)) || server.with_conn(key, |_| ()).is_none());
    server.shutdown();
    drive_until(&mut server, |server| server.is_finished());
}

#[test]
fn publish_between_turns_reaches_every_subscriber_once() {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let mut server = bind(&seen);
    let addr = server.local_addr();
    let subscriber = || {
        std::thread::spawn(move || {
            let (mut c, status, _) = Client::connect(addr, "/?subscribe");
            assert_eq!(status, 101);
            assert_eq!(c.recv(), Some((0x1, b"goal".to_vec())));
        })
    };
    let (a, b) = (subscriber(), subscriber());
    drive_until(&mut server, |_| {
        seen.borrow().iter().filter(|s| matches!(s, Seen::Open(_))).count() == 2
    });
    let (published, reach) = server.publish("news", MessageKind::Text, b"goal");
    assert_eq!((published.loops, published.dropped), (1, 0));
    assert_eq!((reach.delivered, reach.dropped), (2, 0));
    server.flush();
    drive_until(&mut server, |_| a.is_finished() && b.is_finished());
    a.join().unwrap();
    b.join().unwrap();
    // Nobody subscribes any more: a publication reaches no one.
    drive_until(&mut server, |server| {
        server.publish("news", MessageKind::Text, b"x").1.delivered == 0
    });
    server.shutdown();
    drive_until(&mut server, |server| server.is_finished());
}

/// A send past the high watermark says so at once, and the drain to the low watermark is
/// reported to the handler once the client reads.
#[test]
fn a_send_above_the_high_watermark_says_so_and_the_drain_is_reported() {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let marks = Watermarks::new(4 << 10, 16 << 10, 1 << 20).unwrap();
    let options = freeboard::RouteOptions::new().watermarks(marks);
    let router = Router::new().route_with("/", Recorder(seen.clone()), options);
    let mut server = Server::bind_local(config(), router).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let peer = client(server.local_addr(), move |mut c| {
        rx.recv().unwrap(); // read only once the server has filled the queue
        let mut bytes = 0;
        while bytes < 64 << 10 {
            bytes += c.recv().unwrap().1.len();
        }
    });
    drive_until(&mut server, |_| seen.borrow().iter().any(|s| matches!(s, Seen::Open(_))));
    let key = match seen.borrow()[0] {
        Seen::Open(key) => key,
        ref other => panic!("{other:?}"),
    };
    let chunk = vec![b'x'; 1024];
    let outcomes: Vec<_> = (0..64)
        .map(|_| server.with_conn(key, |c| c.send(MessageKind::Binary, &chunk)).unwrap())
        .collect();
    // Nothing was written yet: with its 4-byte header, the 16th message is the first whose
    // bytes pass 16 KiB.
    assert!(outcomes[..15].iter().all(|o| *o == SendOutcome::Queue(PushOutcome::Queued)));
    assert_eq!(outcomes[15], SendOutcome::Queue(PushOutcome::QueuedAboveHigh));
    assert!(server.with_conn(key, |c| c.buffered_amount()).unwrap() >= 64 << 10);
    server.flush();
    tx.send(()).unwrap();
    drive_until(&mut server, |_| seen.borrow().contains(&Seen::Writable(key)));
    drive_until(&mut server, |_| peer.is_finished());
    peer.join().unwrap();
    server.shutdown();
    drive_until(&mut server, |server| server.is_finished());
}

#[test]
fn shutdown_closes_with_1001_and_the_last_turn_says_stopped() {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let mut server = bind(&seen);
    let peer = client(server.local_addr(), |mut c| {
        assert_eq!(c.recv_close(), Some(1001));
        c.send(0x88, &1001u16.to_be_bytes());
        assert!(c.sees_eof());
    });
    drive_until(&mut server, |_| seen.borrow().iter().any(|s| matches!(s, Seen::Open(_))));
    // From another thread, as a signal handler would: the descriptor wakes the host.
    let handle = server.handle();
    std::thread::spawn(move || handle.shutdown()).join().unwrap();
    assert_eq!(server.timeout(), Some(Duration::ZERO));
    drive_until(&mut server, |server| server.is_finished());
    assert!(!server.turn(Some(Duration::ZERO)).unwrap());
    assert!(server.with_conn(ConnKey { slot: 0, serial: 1 }, |_| ()).is_none());
    assert!(seen.borrow().contains(&Seen::Close(1001)));
    peer.join().unwrap();
}

/// A held connection is not read: what its peer sends waits in the socket (TCP's flow
/// control) until the host resumes it, then arrives whole and in order.
#[test]
fn held_input_waits_in_the_socket_until_resumed() {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let mut server = bind(&seen);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let peer = client(server.local_addr(), move |mut c| {
        rx.recv().unwrap(); // send only once the server holds the connection
        for i in 0..10u8 {
            c.send(0x82, &[i]);
        }
        c.send(0x88, &1000u16.to_be_bytes());
        assert_eq!(c.recv_close(), Some(1000));
    });
    drive_until(&mut server, |_| seen.borrow().iter().any(|s| matches!(s, Seen::Open(_))));
    let key = match seen.borrow_mut().remove(0) {
        Seen::Open(key) => key,
        other => panic!("{other:?}"),
    };
    assert!(server.hold_input(key, true));
    tx.send(()).unwrap();
    let until = Instant::now() + Duration::from_millis(300);
    drive_until(&mut server, |_| Instant::now() >= until);
    assert!(seen.borrow().is_empty(), "a held connection was read: {:?}", seen.borrow());
    assert!(server.hold_input(key, false));
    assert_eq!(server.timeout(), Some(Duration::ZERO), "a resumed connection is read at once");
    drive_until(&mut server, |_| seen.borrow().contains(&Seen::Close(1000)));
    let messages: Vec<Vec<u8>> = seen
        .borrow()
        .iter()
        .filter_map(|s| match s {
            Seen::Message(_, data) => Some(data.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(messages, (0..10u8).map(|i| vec![i]).collect::<Vec<_>>());
    peer.join().unwrap();
    assert!(!server.hold_input(key, true), "a closed connection cannot be held");
    server.shutdown();
    drive_until(&mut server, |server| server.is_finished());
}

//! The per-message path of a server session without a socket, for the criterion benchmark
//! (`benches/session.rs`): one read of pipelined masked frames is parsed and unmasked in place,
//! each message is echoed by `Session::send` as the `Echo` handler does, and the replies are
//! written the way the loop writes them — so a change on the path shows in nanoseconds.

use freeboard_buf::{Budget, Pool, PoolConfig};
use freeboard_proto::mask::apply_mask;
use freeboard_proto::{Instant, Role};

use crate::ServerConfig;
use crate::parking::{ParkingLot, ProtocolState};
use crate::session::{Context, Cork, FairShare, Reassembly, Received, Session};

/// An open server session with what the loop lends it, and one read's worth of input.
pub struct EchoSession {
    session: Session,
    pool: Pool<'static>,
    lot: ParkingLot,
    limits: Reassembly,
    share: FairShare,
    cork: Cork,
    /// `messages` masked binary frames of `size` bytes, as a client sends them.
    input: Vec<u8>,
    /// The loop's read buffer: `input` is copied in (as the kernel would) and unmasked there.
    read: Vec<u8>,
    /// The socket: what a write hands to the kernel is copied here.
    socket: Vec<u8>,
    messages: usize,
}

impl EchoSession {
    /// A session under `freeboard serve`'s defaults and a read of `messages` frames of `size`
    /// bytes each.
    pub fn new(size: usize, messages: usize) -> Self {
        let config = ServerConfig::default();
        let pool_config = PoolConfig::new().with_chunk_size(config.chunk_size);
        let pool = Pool::new(Budget::new(64 << 20), pool_config).expect("a 64 MiB pool");
        let protocol = config.limits.protocol();
        let ws = ProtocolState::new(Role::Server, &protocol, Instant::default());
        let queue = config.limits.send_queue();
        // A masked binary frame (§5.2), as a client sends it.
        let key = [0x37, 0xfa, 0x21, 0x3d];
        let mut frame = vec![0x82];
        match size {
            0..=125 => frame.push(0x80 | size as u8),
            126..=65535 => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(size as u16).to_be_bytes());
            }
            _ => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(size as u64).to_be_bytes());
            }
        }
        frame.extend_from_slice(&key);
        let at = frame.len();
        frame.extend((0..size).map(|i| (i % 251) as u8));
        apply_mask(&mut frame[at..], key, 0);
        let input = frame.repeat(messages);
        Self {
            session: Session::open(ws, queue),
            share: FairShare::new(&pool, 1),
            cork: Cork::new(config.read_buffer),
            pool,
            lot: ParkingLot::new(protocol),
            limits: Reassembly::server(config.connection_reserve),
            read: vec![0; input.len()],
            socket: Vec::with_capacity(input.len() * 2),
            input,
            messages,
        }
    }

    /// Messages per [`round`](Self::round).
    pub fn messages(&self) -> usize {
        self.messages
    }

    /// One read: every frame parsed, unmasked and echoed into the cork, then the cork written
    /// (early only when the rest of the read would not fit, as the loop does). Returns the
    /// bytes written.
    pub fn round(&mut self) -> usize {
        self.read.copy_from_slice(&self.input);
        self.socket.clear();
        let mut at = 0;
        while at < self.read.len() {
            let mut cx = Context {
                pool: &mut self.pool,
                lot: &mut self.lot,
                masks: None,
                limits: &self.limits,
                share: &self.share,
                codec: None,
                cork: Some(&mut self.cork),
                now: Instant::default(),
            };
            let (used, received) = self.session.receive(&mut cx, &mut self.read[at..]);
            at += used;
            if let Some(Received::Whole(kind, data)) = received {
                let _ = self.session.send(&mut cx, kind, data);
            }
            if self.session.cork_must_write(&self.cork, &self.read[at..]) {
                self.write();
            }
        }
        self.write();
        // What the cork spilled (nothing, with a socket that takes everything).
        let mut iov = [std::io::IoSlice::new(&[]); 256];
        let n = self.session.io_slices(&self.pool, &mut iov);
        let queued: usize = iov[..n].iter().map(|s| s.len()).sum();
        for slice in &iov[..n] {
            self.socket.extend_from_slice(slice);
        }
        self.session.consume(&mut self.pool, queued);
        self.session.park(&mut self.lot);
        self.socket.len()
    }

    /// Writes the cork into the socket, which takes everything.
    fn write(&mut self) {
        self.socket.extend_from_slice(self.cork.bytes());
        let written = Ok(self.cork.len());
        // NOTE: a socket that takes everything leaves nothing to spill.
        let _ = self.session.corked_written(&mut self.cork, &mut self.pool, written);
    }
}

impl std::fmt::Debug for EchoSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoSession").field("messages", &self.messages).finish_non_exhaustive()
    }
}

//! The driver's turns: what the reader, a send and a flush do with the session and the
//! transport.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::task::{self, Poll, Waker, ready};
use std::time::Duration;

use ::tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use freeboard_buf::{Limit, PushOutcome, Writability};
use freeboard_proto::{CloseCode, Instant, MessageKind, Role, State, Whole};

use super::endpoint::{Endpoint, Hub, HubGuard};
use super::{Conn, Error, IOV, Input, OwnedMessage, Payload, Rare, Shared, spares};
use crate::SendOutcome;
use crate::client::CloseEvent;
use crate::parking::ParkingLot;
use crate::session::{Context, Cork, Received};

/// What one call of the driver borrows beside its connection's state (whose lock it holds):
/// the endpoint's lock, taken the first time the call needs the pool and released before a
/// system call that does not, and the thread's boxes for protocol states, taken the first
/// time the call wakes or parks one and given back when it ends.
pub(super) struct Turn<'e> {
    endpoint: &'e Endpoint,
    hub: Option<HubGuard<'e>>,
    lot: Option<ParkingLot>,
}

impl<'e> Turn<'e> {
    pub(super) fn new(endpoint: &'e Endpoint) -> Self {
        Self { endpoint, hub: None, lot: None }
    }

    /// The thread's boxes for protocol states.
    pub(super) fn lot(&mut self) -> &mut ParkingLot {
        let config = self.endpoint.protocol;
        self.lot.get_or_insert_with(|| spares::take_lot(config))
    }

    /// The endpoint's shared state, locked now if it is not yet.
    pub(super) fn hub(&mut self) -> &mut Hub {
        let endpoint = self.endpoint;
        self.hub.get_or_insert_with(|| endpoint.lock())
    }

    /// Releases the endpoint's lock, if held.
    pub(super) fn unlock(&mut self) {
        self.hub = None;
    }

    /// What a session borrows for one call (the endpoint's lock taken).
    pub(super) fn cx<'a>(
        &'a mut self,
        role: Role,
        now: Instant,
        cork: Option<&'a mut Cork>,
    ) -> Context<'a> {
        let (endpoint, config) = (self.endpoint, self.endpoint.protocol);
        let lot = self.lot.get_or_insert_with(|| spares::take_lot(config));
        self.hub.get_or_insert_with(|| endpoint.lock()).cx(lot, role, now, cork)
    }

    /// A cork for a connection that read.
    fn lend_cork(&mut self) -> Box<Cork> {
        self.endpoint.corking.fetch_add(1, Ordering::Relaxed);
        spares::cork(self.endpoint.read_buffer)
    }

    /// Takes back an empty cork.
    fn take_back_cork(&mut self, cork: Box<Cork>) {
        self.endpoint.corking.fetch_sub(1, Ordering::Relaxed);
        spares::keep_cork(cork);
    }

    /// Takes back a read buffer a connection held.
    pub(super) fn give_back(&mut self, bytes: Box<[u8]>) {
        self.endpoint.reading.fetch_sub(1, Ordering::Relaxed);
        spares::keep_read_buffer(bytes);
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(lot) = self.lot.take() {
            spares::keep_lot(lot);
        }
    }
}

/// A [`send_async`](super::WsWriter::send_async) in progress: the message, until queued.
/// Dropped before it is done, it takes its connection out of the endpoint's waiters for room.
pub(super) struct SendWait<'a, S> {
    shared: &'a Shared<S>,
    kind: MessageKind,
    /// The message's bytes; `None` once the send is done.
    payload: Option<Vec<u8>>,
}

impl<'a, S: AsyncRead + AsyncWrite + Unpin> SendWait<'a, S> {
    pub(super) fn new(shared: &'a Shared<S>, kind: MessageKind, payload: Vec<u8>) -> Self {
        Self { shared, kind, payload: Some(payload) }
    }

    /// Sends what the Sink holds first, then the message; `Ready` with the final outcome.
    pub(super) fn poll(&mut self, task: &mut task::Context<'_>) -> Poll<SendOutcome> {
        let shared = self.shared;
        let mut guard = shared.lock();
        let conn = &mut *guard;
        let mut turn = Turn::new(&shared.endpoint);
        let outcome = match ready!(shared.poll_held_in(conn, &mut turn, task)) {
            Err(_) => SendOutcome::Closed,
            Ok(()) => {
                // NOTE(unwrap): a future is not polled after it returned `Ready`.
                let payload = self.payload.as_deref().expect("polled after completion");
                ready!(shared.poll_offer(conn, &mut turn, task, self.kind, payload))
            }
        };
        conn.schedule_write(&mut turn);
        if let Some(payload) = self.payload.take() {
            spares::keep_payload(payload);
        }
        Poll::Ready(outcome)
    }
}

impl<S> Drop for SendWait<'_, S> {
    fn drop(&mut self) {
        if self.payload.is_none() {
            return;
        }
        let mut conn = self.shared.lock();
        if let Some(rare) = &mut conn.rare
            && rare.room_slot.is_some()
        {
            let identity = self.shared.identity();
            self.shared.endpoint.lock().stop_waiting_for_room(&mut rare.room_slot, identity);
        }
    }
}

impl<S> Shared<S> {
    /// This connection's identity among the endpoint's waiters: the address of its state,
    /// unique while it lives.
    fn identity(&self) -> usize {
        std::ptr::from_ref(self).addr()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Conn<S>> {
        self.conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn fmt(&self, name: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let conn = self.lock();
        f.debug_struct(name)
            .field("state", &conn.session.state())
            .field("buffered_amount", &conn.session.buffered())
            .finish_non_exhaustive()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Shared<S> {
    pub(super) fn send(&self, kind: MessageKind, payload: Payload<'_>) -> SendOutcome {
        let mut guard = self.lock();
        let conn = &mut *guard;
        if conn.session.state() != State::Open {
            return SendOutcome::Closed;
        }
        let mut turn = Turn::new(&self.endpoint);
        let data = match &payload {
            Payload::Borrowed(data) => data,
            Payload::Owned(data) => &data[..],
        };
        let outcome = conn.offer(&mut turn, kind, data);
        if let Payload::Owned(spent) = payload {
            spares::keep_payload(spent);
        }
        conn.schedule_write(&mut turn);
        outcome
    }

    /// The Sink's `start_send`: queues the message, or holds it when the `block` policy
    /// refuses it (and behind any message held already, to keep their order).
    pub(super) fn send_or_hold(&self, kind: MessageKind, payload: Vec<u8>) -> Result<(), Error> {
        let mut guard = self.lock();
        let conn = &mut *guard;
        if conn.session.state() != State::Open {
            return Err(Error::Closed);
        }
        if conn.rare.as_ref().is_some_and(|rare| !rare.held.is_empty()) {
            conn.rare().held.push_back((kind, payload));
            return Ok(());
        }
        let mut turn = Turn::new(&self.endpoint);
        let outcome = conn.offer(&mut turn, kind, &payload);
        match outcome {
            SendOutcome::Queue(PushOutcome::WouldBlock { .. }) => {
                conn.rare().held.push_back((kind, payload));
            }
            _ => spares::keep_payload(payload),
        }
        conn.schedule_write(&mut turn);
        match outcome {
            SendOutcome::Closed => Err(Error::Closed),
            _ => Ok(()),
        }
    }

    /// Sends the messages the Sink holds, in order, waiting for room as
    /// [`SendWait`] does. `Err(Closed)` if the connection closed with messages held (they
    /// are discarded: the error is how the producer hears of them).
    pub(super) fn poll_held(&self, task: &mut task::Context<'_>) -> Poll<Result<(), Error>> {
        let mut guard = self.lock();
        let conn = &mut *guard;
        if conn.rare.as_ref().is_none_or(|rare| rare.held.is_empty()) {
            return Poll::Ready(Ok(()));
        }
        let mut turn = Turn::new(&self.endpoint);
        let result = ready!(self.poll_held_in(conn, &mut turn, task));
        // Not while waiting: this task was just registered among the writers, and a write
        // scheduled then would wake it at once.
        conn.schedule_write(&mut turn);
        Poll::Ready(result)
    }

    /// [`poll_held`](Self::poll_held) with the connection locked, leaving the write of what
    /// it queued to the caller.
    fn poll_held_in(
        &self,
        conn: &mut Conn<S>,
        turn: &mut Turn<'_>,
        task: &mut task::Context<'_>,
    ) -> Poll<Result<(), Error>> {
        loop {
            let Some((kind, payload)) = conn.rare.as_mut().and_then(|rare| rare.held.pop_front())
            else {
                return Poll::Ready(Ok(()));
            };
            match self.poll_offer(conn, turn, task, kind, &payload) {
                Poll::Pending => {
                    conn.rare().held.push_front((kind, payload));
                    return Poll::Pending;
                }
                Poll::Ready(SendOutcome::Closed) => {
                    conn.rare().held.clear();
                    return Poll::Ready(Err(Error::Closed));
                }
                Poll::Ready(_) => spares::keep_payload(payload),
            }
        }
    }

    /// One turn of a send that waits for room (`conn` is this connection's, locked): queues
    /// `data` unless the `block` policy refuses it; refused, writes what is queued (which
    /// may make the room) and tries once more; refused again, registers `task` to be woken
    /// by the queue's writes or the close (the writers' list) and, when the pool was short,
    /// by the endpoint once the pool has more room. The registration is made under the
    /// locks the refusal was judged under, so no write or release between them is missed.
    fn poll_offer(
        &self,
        conn: &mut Conn<S>,
        turn: &mut Turn<'_>,
        task: &mut task::Context<'_>,
        kind: MessageKind,
        data: &[u8],
    ) -> Poll<SendOutcome> {
        let mut wrote = false;
        loop {
            let outcome = match conn.session.state() {
                State::Open => conn.offer(turn, kind, data),
                _ => SendOutcome::Closed,
            };
            let SendOutcome::Queue(PushOutcome::WouldBlock { limit }) = outcome else {
                if let Some(rare) = &mut conn.rare
                    && rare.room_slot.is_some()
                {
                    turn.hub().stop_waiting_for_room(&mut rare.room_slot, self.identity());
                }
                return Poll::Ready(outcome);
            };
            if !wrote {
                wrote = true;
                let _ = conn.write(turn, task);
                continue;
            }
            let rare = conn.rare.get_or_insert_with(Box::default);
            if limit == Limit::Pool {
                // At least its 2-byte frame header (§5.2): a lower bound, so a waiter is
                // never left asleep when its message would fit.
                let framed = data.len() + 2;
                turn.hub().wait_for_room(
                    &mut rare.room_slot,
                    self.identity(),
                    framed,
                    task.waker(),
                );
            }
            if !rare.writers.iter().any(|w| w.will_wake(task.waker())) {
                rare.writers.push(task.waker().clone());
            }
            return Poll::Pending;
        }
    }

    pub(super) fn close(&self, code: CloseCode, reason: &str) -> Result<(), Error> {
        let mut guard = self.lock();
        let conn = &mut *guard;
        if conn.session.state() != State::Open {
            return Err(Error::Closed);
        }
        let mut turn = Turn::new(&self.endpoint);
        let cx = &mut turn.cx(conn.role, self.endpoint.now(), conn.cork.as_deref_mut());
        conn.session.close(cx, code, reason).map_err(Error::Usage)?;
        conn.note_close();
        conn.schedule_write(&mut turn);
        Ok(())
    }

    pub(super) fn open_or_closed(&self) -> Result<(), Error> {
        match self.lock().session.state() {
            State::Open => Ok(()),
            _ => Err(Error::Closed),
        }
    }

    /// Writes until the queue is writable (`all`: empty), the transport cannot take more
    /// now (`Pending`), or the connection can no longer write.
    pub(super) fn poll_writable(&self, task: &mut task::Context<'_>, all: bool) -> Poll<()> {
        let mut conn = self.lock();
        let mut turn = Turn::new(&self.endpoint);
        let written = conn.write(&mut turn, task);
        let done = match conn.session.state() {
            State::Closed => true,
            _ if all => written.is_ready(),
            _ => conn.session.queue().is_writable(),
        };
        if done {
            return Poll::Ready(());
        }
        let writers = &mut conn.rare().writers;
        if !writers.iter().any(|w| w.will_wake(task.waker())) {
            writers.push(task.waker().clone());
        }
        Poll::Pending
    }

    /// The driver's turn for the reader: write what is queued, deliver what was read, run
    /// the timers, read.
    pub(super) fn poll_recv(&self, task: &mut task::Context<'_>) -> Poll<Option<OwnedMessage>> {
        let endpoint = &*self.endpoint;
        let mut guard = self.lock();
        let conn = &mut *guard;
        let mut turn = Turn::new(endpoint);
        if conn.reader.as_ref().is_none_or(|w| !w.will_wake(task.waker())) {
            conn.reader = Some(task.waker().clone());
        }
        conn.reader_waits = false;
        loop {
            // The application replies to a message once it is handed out, so the cork is
            // judged before the parse, against the frame about to be handed out.
            if let (Some(cork), Some(input)) = (conn.cork.as_deref(), conn.input.as_ref())
                && conn
                    .session
                    .cork_must_write(cork, &input.bytes[input.at as usize..input.end as usize])
            {
                let _ = conn.write(&mut turn, task);
            }
            if let Some(message) = conn.parse(&mut turn) {
                // What the application queues while it takes the messages of one read leaves
                // in one write once they are taken (or sooner: past the high watermark, or
                // before a frame whose reply might not fit in the cork, above).
                if !conn.session.queue().is_writable() {
                    let _ = conn.write(&mut turn, task);
                }
                return Poll::Ready(Some(message));
            }
            let _ = conn.write(&mut turn, task);
            if let Some(close) = conn.close.take() {
                // Our answer to the peer's close leaves before the application hears of it.
                let _ = conn.write(&mut turn, task);
                conn.ended = true;
                conn.release_input(&mut turn);
                return Poll::Ready(Some(OwnedMessage::Close(*close)));
            }
            if conn.ended || conn.session.state() == State::Closed {
                conn.ended = true;
                return Poll::Ready(None);
            }
            let role = conn.role;
            if let Some(at) = conn.session.poll_timeout() {
                let now = endpoint.now();
                if at <= now {
                    conn.session.handle_timeout(&mut turn.cx(role, now, conn.cork.as_deref_mut()));
                    conn.note_close();
                    continue;
                }
                let deadline = endpoint.start + Duration::from_millis(at.as_millis());
                let timer = &mut conn.rare.get_or_insert_with(Box::default).timer;
                let timer = match timer {
                    Some(timer) => {
                        if timer.deadline() != deadline {
                            timer.as_mut().reset(deadline);
                        }
                        timer
                    }
                    None => timer.insert(Box::pin(::tokio::time::sleep_until(deadline))),
                };
                if timer.as_mut().poll(task).is_ready() {
                    continue;
                }
            }
            if !conn.session.wants_input() {
                // Paused above the high watermark: the write that drains the queue wakes us.
                conn.session.park(turn.lot());
                conn.reader_waits = true;
                return Poll::Pending;
            }
            // The read is a system call: other connections may use the pool meanwhile.
            turn.unlock();
            let mut bytes = spares::read_buffer(endpoint.read_buffer);
            let mut buf = ReadBuf::new(&mut bytes);
            let read = Pin::new(&mut conn.io).poll_read(task, &mut buf);
            let n = buf.filled().len();
            match read {
                Poll::Ready(Ok(())) if n > 0 => {
                    conn.read_at = endpoint.now();
                    endpoint.reading.fetch_add(1, Ordering::Relaxed);
                    conn.input = Some(Input { bytes, at: 0, end: n as u32 });
                    if conn.cork.is_none() {
                        conn.cork = Some(turn.lend_cork());
                    }
                    // Awake for the common message and reply, which take no endpoint lock.
                    conn.session.wake(turn.lot());
                }
                Poll::Ready(result) => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "read failed");
                    }
                    spares::keep_read_buffer(bytes);
                    conn.session.handle_eof(&mut turn.cx(role, endpoint.now(), None));
                    conn.note_close();
                }
                Poll::Pending => {
                    spares::keep_read_buffer(bytes);
                    conn.session.park(turn.lot());
                    conn.reader_waits = true;
                    return Poll::Pending;
                }
            }
        }
    }
}

impl<S> Conn<S> {
    /// Queues one message of an open connection (the endpoint's lock taken only if the
    /// cork cannot take it) and says what the queue did.
    #[inline]
    fn offer(&mut self, turn: &mut Turn<'_>, kind: MessageKind, data: &[u8]) -> SendOutcome {
        // The common reply joins the cork under this connection's lock alone; anything else
        // (a queue past the cork, a pool that is contended) takes the endpoint's.
        let room = turn.endpoint.cork_room.load(Ordering::Relaxed);
        let corked = match (self.role, self.cork.as_deref_mut()) {
            (Role::Server, Some(cork)) => self.session.send_corked(cork, room, kind, data),
            _ => None,
        };
        let outcome = match corked {
            Some(outcome) => Some(outcome),
            None => {
                let cx = &mut turn.cx(self.role, self.read_at, self.cork.as_deref_mut());
                self.session.send(cx, kind, data)
            }
        };
        if let Some(outcome @ (PushOutcome::Dropped { .. } | PushOutcome::MustClose { .. })) =
            &outcome
        {
            turn.endpoint.count_push(self.session.queue().policy(), outcome, false);
        }
        self.note_close();
        if corked.is_none() && self.input.is_none() && self.cork.is_none() {
            // A send outside the reader's turn (another task's, maybe on another worker) woke
            // the state into this thread's boxes: it parks back into them at once, as the
            // event loop parks at the end of a turn, so boxes do not drift from the threads
            // that send to those that read.
            self.session.park(turn.lot());
        }
        outcome.map_or(SendOutcome::Closed, SendOutcome::from)
    }

    /// The rarely used state, boxed at its first use.
    pub(super) fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Bytes queued or corked and not yet written.
    pub(super) fn buffered(&self) -> usize {
        self.session.buffered() + self.cork.as_ref().map_or(0, |cork| cork.len())
    }

    /// After a write that took `written` of the cork's bytes: the rest moves into the send
    /// queue, and the cork goes back to the thread's spares unless `keep` (more replies to a
    /// read being parsed will follow). A failed write, or a pool that cannot hold the rest
    /// (the stream would be torn), ends the connection. A cork written whole needs no pool.
    pub(super) fn uncork(&mut self, turn: &mut Turn<'_>, written: io::Result<usize>, keep: bool) {
        let Some(mut cork) = self.cork.take() else { return };
        if matches!(written, Ok(n) if n == cork.len()) {
            cork.clear();
        } else if !cork.is_empty() {
            let written = self.session.corked_written(&mut cork, &mut turn.hub().pool, written);
            if let Err(e) = written {
                tracing::debug!(error = %e, "write failed");
                self.fail(turn);
            }
        }
        if keep && self.session.state() == State::Open {
            self.cork = Some(cork);
        } else {
            turn.take_back_cork(cork);
        }
    }

    /// The transport failed: the connection is over (1006 unless the close handshake was
    /// done) and nothing it queued will leave.
    pub(super) fn fail(&mut self, turn: &mut Turn<'_>) {
        self.session.handle_eof(&mut turn.cx(self.role, Instant::default(), None));
        self.session.clear_queue(&mut turn.hub().pool);
        self.note_close();
        self.wake_all();
    }

    pub(super) fn wake_all(&mut self) {
        if let Some(reader) = &self.reader {
            reader.wake_by_ref();
        }
        self.wake_writers();
    }

    /// Wakes the tasks waiting in `writable` or `flush`.
    fn wake_writers(&mut self) {
        if let Some(rare) = &mut self.rare {
            for writer in rare.writers.drain(..) {
                writer.wake();
            }
        }
    }

    /// Keeps the session's close, once reported, for the reader; once the session no longer
    /// sends, wakes the tasks waiting to send (or flush) so they hear `Closed`.
    pub(super) fn note_close(&mut self) {
        if let Some(closed) = self.session.poll_close() {
            self.close = Some(close_event(&closed));
        }
        if self.session.state() != State::Open {
            self.wake_writers();
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// Parses read bytes until a message completes or they are used up (then the buffer goes
    /// back to the thread's spares). The common message needs no pool, so no endpoint lock.
    pub(super) fn parse(&mut self, turn: &mut Turn<'_>) -> Option<OwnedMessage> {
        let input = self.input.as_mut()?;
        while input.at < input.end && self.close.is_none() {
            let (at, end) = (input.at as usize, input.end as usize);
            let buf = &mut input.bytes[at..end];
            let (used, received) = match self.session.receive_whole(self.read_at, buf) {
                Some(Whole { consumed, kind, data }) => {
                    (consumed, Some(Received::Whole(kind, data)))
                }
                None => {
                    let cx = &mut turn.cx(self.role, self.read_at, self.cork.as_deref_mut());
                    self.session.receive(cx, &mut input.bytes[at..end])
                }
            };
            input.at += used as u32;
            let message = match received {
                None => None,
                Some(Received::Whole(kind, data)) => {
                    let mut payload = spares::payload(data.len());
                    payload.extend_from_slice(data);
                    Some(OwnedMessage::received(kind, payload))
                }
                Some(Received::Assembled(kind)) => {
                    let mut chain = self.session.take_message();
                    let mut data = spares::payload(chain.len());
                    let hub = turn.hub();
                    chain.segments(&hub.pool).for_each(|s| data.extend_from_slice(s));
                    chain.clear(&mut hub.pool);
                    Some(OwnedMessage::received(kind, data))
                }
            };
            // `note_close`, with the input borrowed.
            if let Some(closed) = self.session.poll_close() {
                self.close = Some(close_event(&closed));
            }
            if self.session.state() != State::Open
                && let Some(rare) = &mut self.rare
            {
                rare.writers.drain(..).for_each(Waker::wake);
            }
            if message.is_some() {
                if input.at == input.end {
                    self.release_input(turn);
                }
                return message;
            }
        }
        self.release_input(turn);
        None
    }

    pub(super) fn release_input(&mut self, turn: &mut Turn<'_>) {
        if let Some(input) = self.input.take() {
            turn.give_back(input.bytes);
        }
    }

    /// After a send or a close queued bytes: the reader writes them at its next turn (woken
    /// if it waits for input; a reader that is handling a message writes when it asks for
    /// the next one, and waking its task would only poll it once more for nothing); without a
    /// reader they are written now, as far as the transport takes them.
    pub(super) fn schedule_write(&mut self, turn: &mut Turn<'_>) {
        if self.session.buffered() == 0 || self.write_requested {
            return;
        }
        if let Some(reader) = &self.reader {
            if self.reader_waits {
                self.write_requested = true;
                reader.wake_by_ref();
            }
        } else if let Some(writer) = self.rare.as_ref().and_then(|rare| rare.writers.first()) {
            // A task waits in `writable` or `flush` with the transport's write interest.
            writer.wake_by_ref();
        } else {
            let _ = self.write(turn, &mut task::Context::from_waker(Waker::noop()));
        }
    }

    /// Writes the queued bytes in vectored writes until the queue is empty (`Ready`) or the
    /// transport would block (`Pending`, its write interest registered for `task`). Wakes
    /// the reader and writers at a watermark crossing. After the close handshake the
    /// server's writing side is shut down once everything is out (§7.1.1).
    pub(super) fn write(&mut self, turn: &mut Turn<'_>, task: &mut task::Context<'_>) -> Poll<()> {
        self.write_requested = false;
        // The cork first: it holds replies queued before anything the queue holds. It is the
        // connection's own: no other connection waits on the endpoint's lock for this write.
        let corked = match &self.cork {
            Some(cork) if !cork.is_empty() => {
                turn.unlock();
                match Pin::new(&mut self.io).poll_write(task, cork.bytes()) {
                    Poll::Ready(Ok(0)) => Err(io::ErrorKind::WriteZero.into()),
                    Poll::Ready(written) => written,
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
            _ => Ok(0),
        };
        self.uncork(turn, corked, self.input.is_some());
        let mut result = Poll::Ready(());
        while self.session.buffered() > 0 {
            // The queue's bytes are pool chunks: they are written under the endpoint's lock.
            let written = {
                let hub = turn.hub();
                let mut iov = [IoSlice::new(&[]); IOV];
                let n = self.session.io_slices(&hub.pool, &mut iov);
                Pin::new(&mut self.io).poll_write_vectored(task, &iov[..n])
            };
            match written {
                Poll::Ready(Ok(n)) if n > 0 => self.session.consume(&mut turn.hub().pool, n),
                Poll::Ready(result) => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "write failed");
                    }
                    self.fail(turn);
                    break;
                }
                Poll::Pending => {
                    result = Poll::Pending;
                    break;
                }
            }
        }
        if result.is_ready() && Pin::new(&mut self.io).poll_flush(task).is_pending() {
            result = Poll::Pending;
        }
        if let Some(Writability::Writable) = self.session.take_writability() {
            self.wake_all();
        }
        if result.is_ready() {
            self.wake_writers();
            if self.session.state() == State::Closed && !self.shut_down && self.role == Role::Server
            {
                match Pin::new(&mut self.io).poll_shutdown(task) {
                    Poll::Ready(_) => self.shut_down = true,
                    Poll::Pending => result = Poll::Pending,
                }
            }
        }
        result
    }
}

impl<S> Drop for Shared<S> {
    fn drop(&mut self) {
        let identity = self.identity();
        let conn = self.conn.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut turn = Turn::new(&self.endpoint);
        if let Some(input) = conn.input.take() {
            turn.give_back(input.bytes);
        }
        if let Some(mut cork) = conn.cork.take() {
            cork.clear();
            turn.take_back_cork(cork);
        }
        let hub = turn.hub();
        conn.session.release(&mut hub.pool);
        if let Some(rare) = &mut conn.rare {
            if let Some(token) = rare.token.take() {
                hub.subscriptions.drop_conn(&self.endpoint.topics, token);
                hub.subscribers.remove(token);
            }
            hub.stop_waiting_for_room(&mut rare.room_slot, identity);
        }
        hub.count_open(-1);
    }
}

fn close_event(closed: &crate::session::Closed) -> Box<CloseEvent> {
    Box::new(CloseEvent {
        code: closed.code,
        reason: closed.reason().to_owned(),
        was_clean: closed.clean,
    })
}

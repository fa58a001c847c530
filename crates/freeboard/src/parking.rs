//! Idle connections park their protocol state: 24 bytes inline instead of a boxed 424-byte
//! [`Connection`], so a loop holding 10,000 quiet connections holds no protocol buffers
//! either. A connection wakes into a spare box when its socket, a timer or a send needs the
//! full state, and parks again at the end of the turn if nothing is left in flight.

use freeboard_proto::{Config, Connection, Instant, Parked, Role, State};

/// Spare boxes kept for waking connections: a turn that wakes at most this many allocates
/// nothing.
const SPARE: usize = 256;

/// One connection's protocol state.
pub(crate) enum ProtocolState {
    Awake(Box<Connection>),
    Parked(Parked),
}

impl ProtocolState {
    /// A connection whose opening handshake has just completed: parked from the start.
    pub(crate) fn new(role: Role, config: &Config, now: Instant) -> Self {
        ProtocolState::Parked(Parked::new(role, config, now))
    }

    pub(crate) fn state(&self) -> State {
        match self {
            ProtocolState::Awake(ws) => ws.state(),
            ProtocolState::Parked(_) => State::Open,
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self {
            ProtocolState::Awake(ws) => ws.poll_timeout(),
            ProtocolState::Parked(parked) => parked.poll_timeout(),
        }
    }

    /// The full state if awake; a parked connection has no events and owes no frames.
    pub(crate) fn awake(&mut self) -> Option<&mut Connection> {
        match self {
            ProtocolState::Awake(ws) => Some(ws),
            ProtocolState::Parked(_) => None,
        }
    }
}

/// The spare boxes of one event loop and the configuration parked connections resume with.
pub(crate) struct ParkingLot {
    #[expect(clippy::vec_box, reason = "the boxes move into `ProtocolState::Awake` as they are")]
    spare: Vec<Box<Connection>>,
    config: Config,
}

impl ParkingLot {
    pub(crate) fn new(config: Config) -> Self {
        Self { spare: Vec::with_capacity(SPARE), config }
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// Resumes the connections it wakes next with `config`: a tokio worker thread keeps one
    /// lot for the connections of every endpoint it drives.
    #[cfg(feature = "tokio")]
    pub(crate) fn reconfigure(&mut self, config: Config) {
        self.config = config;
    }

    /// The full state of `ws`, waking it if parked.
    pub(crate) fn wake<'w>(&mut self, ws: &'w mut ProtocolState) -> &'w mut Connection {
        if let ProtocolState::Parked(parked) = *ws {
            let state = parked.resume(self.config);
            *ws = ProtocolState::Awake(match self.spare.pop() {
                Some(mut spare) => {
                    *spare = state;
                    spare
                }
                None => Box::new(state),
            });
        }
        match ws {
            ProtocolState::Awake(connection) => connection,
            ProtocolState::Parked(_) => unreachable!("woken above"),
        }
    }

    /// Gives back the spare boxes of a burst that is over.
    pub(crate) fn shrink(&mut self) {
        self.spare = Vec::with_capacity(SPARE);
    }

    /// Parks `ws` if it is awake with nothing in flight, keeping its box for the next wake.
    pub(crate) fn park(&mut self, ws: &mut ProtocolState) {
        let ProtocolState::Awake(awake) = ws else { return };
        let Some(parked) = awake.park() else { return };
        if let ProtocolState::Awake(spare) = std::mem::replace(ws, ProtocolState::Parked(parked))
            && self.spare.len() < SPARE
        {
            self.spare.push(spare);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_parks_wakes_and_reuses_the_box() {
        let config = Config::default();
        let mut lot = ParkingLot::new(config);
        let mut ws = ProtocolState::new(Role::Server, &config, Instant::default());
        assert!(ws.awake().is_none(), "parked from the start");
        let first: *const Connection = lot.wake(&mut ws);
        assert_eq!(ws.state(), State::Open);
        lot.park(&mut ws);
        assert!(matches!(ws, ProtocolState::Parked(_)));
        let mut other = ProtocolState::new(Role::Server, &config, Instant::default());
        let second: *const Connection = lot.wake(&mut other);
        assert_eq!(first, second, "the spare box is reused");

        // A connection that is closing stays awake.
        let _ = lot.wake(&mut ws).close(Instant::default(), freeboard_proto::CloseCode::NORMAL, "");
        lot.park(&mut ws);
        assert!(ws.awake().is_some());
    }
}

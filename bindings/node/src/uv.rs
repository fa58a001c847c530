//! The two libuv handles a server needs on Node's event loop: a `uv_poll_t` on the freeboard
//! loop's epoll descriptor and a `uv_timer_t` for its deadlines. Node exports libuv's
//! symbols to addons (its documented ABI for `uv_*` calls), so they are declared here and
//! resolved when `node` loads the addon. The handles are opaque: their size comes from
//! `uv_handle_size`, and only their first field (`void *data`, the same in every libuv
//! handle) is touched.

use std::ffi::{c_int, c_void};

/// `uv_handle_type` values (`UV_HANDLE_TYPE_MAP` in uv.h, counted from `UV_UNKNOWN_HANDLE`).
const UV_POLL: c_int = 8;
const UV_TIMER: c_int = 13;
/// `uv_poll_event::UV_READABLE`.
const UV_READABLE: c_int = 1;

unsafe extern "C" {
    fn uv_handle_size(kind: c_int) -> usize;
    fn uv_poll_init(event_loop: *mut c_void, handle: *mut c_void, fd: c_int) -> c_int;
    fn uv_poll_start(
        handle: *mut c_void,
        events: c_int,
        cb: unsafe extern "C" fn(*mut c_void, c_int, c_int),
    ) -> c_int;
    fn uv_timer_init(event_loop: *mut c_void, handle: *mut c_void) -> c_int;
    fn uv_timer_start(
        handle: *mut c_void,
        cb: unsafe extern "C" fn(*mut c_void),
        timeout: u64,
        repeat: u64,
    ) -> c_int;
    fn uv_timer_stop(handle: *mut c_void) -> c_int;
    fn uv_unref(handle: *mut c_void);
    fn uv_close(handle: *mut c_void, cb: Option<unsafe extern "C" fn(*mut c_void)>);
}

/// Room for a handle: libuv's handles are about 160 bytes on 64-bit Linux; a larger one
/// (another libuv build) is refused rather than overrun.
type Memory = [u64; 64];

/// A libuv handle in memory of our own, whose `data` field points at what its callback
/// serves.
///
/// Invariant: once initialised, the memory stays where it is until libuv's close callback
/// has run ([`close`](Self::close) hands it to libuv and frees it there).
pub(crate) struct Handle {
    memory: *mut Memory,
}

impl Handle {
    fn allocate(kind: c_int, data: *const c_void) -> Result<Self, c_int> {
        // SAFETY: uv_handle_size only reads its argument.
        if unsafe { uv_handle_size(kind) } > size_of::<Memory>() {
            return Err(-1);
        }
        let memory = Box::into_raw(Box::new([0u64; 64]));
        // SAFETY: `data` is the handle's first field.
        unsafe { *(memory as *mut *const c_void) = data };
        Ok(Self { memory })
    }

    /// A `uv_poll_t` watching `fd` for readability on `event_loop`, calling `cb`.
    ///
    /// # Safety
    /// `event_loop` is the running loop of the calling (JavaScript) thread; `data` outlives
    /// the handle.
    pub(crate) unsafe fn poll(
        event_loop: *mut c_void,
        fd: c_int,
        data: *const c_void,
        cb: unsafe extern "C" fn(*mut c_void, c_int, c_int),
    ) -> Result<Self, c_int> {
        let handle = Self::allocate(UV_POLL, data)?;
        // SAFETY: a zeroed handle of the size libuv asked for; the caller vouches for the loop.
        let status = unsafe { uv_poll_init(event_loop, handle.memory.cast(), fd) };
        if status != 0 {
            handle.free();
            return Err(status);
        }
        // SAFETY: initialised just above.
        match unsafe { uv_poll_start(handle.memory.cast(), UV_READABLE, cb) } {
            0 => Ok(handle),
            status => {
                handle.close();
                Err(status)
            }
        }
    }

    /// A `uv_timer_t` on `event_loop` that does not keep the process alive by itself.
    ///
    /// # Safety
    /// As for [`poll`](Self::poll).
    pub(crate) unsafe fn timer(
        event_loop: *mut c_void,
        data: *const c_void,
    ) -> Result<Self, c_int> {
        let handle = Self::allocate(UV_TIMER, data)?;
        // SAFETY: as in `poll`.
        match unsafe { uv_timer_init(event_loop, handle.memory.cast()) } {
            0 => {
                // SAFETY: initialised.
                unsafe { uv_unref(handle.memory.cast()) };
                Ok(handle)
            }
            status => {
                handle.free();
                Err(status)
            }
        }
    }

    /// (Re)starts a timer handle to call `cb` once after `ms` milliseconds.
    pub(crate) fn start_timer(&self, ms: u64, cb: unsafe extern "C" fn(*mut c_void)) {
        // SAFETY: an initialised timer handle (only `timer` makes handles this is called on).
        unsafe { uv_timer_start(self.memory.cast(), cb, ms, 0) };
    }

    /// Stops a timer handle.
    pub(crate) fn stop_timer(&self) {
        // SAFETY: as in `start_timer`.
        unsafe { uv_timer_stop(self.memory.cast()) };
    }

    /// The `data` pointer a callback's handle carries.
    ///
    /// # Safety
    /// `handle` is a handle made by this module.
    pub(crate) unsafe fn data_of(handle: *mut c_void) -> *const c_void {
        // SAFETY: the first field of every handle is `data`.
        unsafe { *(handle as *const *const c_void) }
    }

    /// Closes the handle; its memory is freed in libuv's close callback.
    pub(crate) fn close(self) {
        unsafe extern "C" fn closed(handle: *mut c_void) {
            // SAFETY: the memory of a `Handle`, handed over by `close`.
            Handle { memory: handle.cast() }.free();
        }
        // SAFETY: an initialised handle; libuv calls `closed` once it no longer uses it.
        unsafe { uv_close(self.memory.cast(), Some(closed)) };
    }

    fn free(self) {
        // SAFETY: allocated by `allocate`, and no longer known to libuv.
        drop(unsafe { Box::from_raw(self.memory) });
    }
}

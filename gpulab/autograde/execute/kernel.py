"""How nbgrader starts and talks to a student's kernel in the sandbox: :class:`JailedKernelManager`
starts it through its cgroup leaf, ``setpriv`` and :mod:`gpulab.confine.jail`, and
:class:`CappedKernelClient` refuses a message too big to read without nbgrader's memory growing.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import zmq
import zmq.asyncio
from jupyter_client import AsyncKernelManager
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from traitlets import DottedObjectName, Integer, List, Type, Unicode

from gpulab.confine import isolation

# The largest message nbgrader reads from the kernel: past it, libzmq drops the connection instead
# of reading the message into nbgrader's memory. A plot is well under 1 MiB.
MAX_MESSAGE_BYTES = 32 * 2**20


class TolerantChannel(AsyncZMQSocketChannel):
    """A channel that drops a message it cannot read (a bad signature, torn frames: a kernel that ran
    out of threads mid-send, or forged bytes) instead of failing the whole grading run; what the
    message carried is then missing, which fails only what needed it."""

    async def _recv(self, **kwargs: object) -> dict:
        while True:
            msg = await self.socket.recv_multipart(**kwargs)
            try:
                _, smsg = self.session.feed_identities(msg)
                return self.session.deserialize(smsg)
            except (ValueError, TypeError, KeyError) as err:
                self.dropped = getattr(self, "dropped", 0) + 1
                if self.dropped <= 3:
                    print(f"gpulab: dropped a message the kernel sent that could not be read ({str(err)[:80]})",
                          file=sys.stderr, flush=True)


class CappedKernelClient(AsyncKernelClient):
    """jupyter_client's client whose sockets refuse a message over :data:`MAX_MESSAGE_BYTES` (libzmq
    reads a message whole: one huge ``print`` would cost nbgrader four times its size). libzmq then
    drops the connection for good: :meth:`iopub_lost` notices, :meth:`reopen_iopub` reconnects."""

    shell_channel_class = Type(TolerantChannel)
    iopub_channel_class = Type(TolerantChannel)

    def _context_default(self) -> zmq.asyncio.Context:
        self._created_context = True
        ctx = zmq.asyncio.Context()
        ctx.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        return ctx

    def connect_iopub(self, identity: bytes | None = None) -> zmq.Socket:
        sock = super().connect_iopub(identity)
        self._watch = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._watch_sync = zmq.Socket.shadow(self._watch.underlying)  # polled without an event loop
        return sock

    def iopub_lost(self) -> bool:
        """Whether the IOPub connection was dropped (an oversized message)."""
        watch = getattr(self, "_watch_sync", None)
        return bool(watch is not None and watch.poll(0))

    async def reopen_iopub(self, timeout: float = 30) -> None:
        """A fresh IOPub socket, once the kernel's messages reach it."""
        old = self._iopub_channel
        self._iopub_channel = None
        if old is not None:
            old.socket.disable_monitor()
            self._watch.close(linger=0)
            old.close()
        self.iopub_channel.start()
        await self._async_wait_for_ready(timeout=timeout)


class JailedKernelManager(AsyncKernelManager):
    """Starts the kernel through ``kernel_prefix`` (``setpriv``) and ``python -m gpulab.confine.jail``,
    which exec it in place, so interrupts and kills reach the kernel itself. The jail's audit log
    crosses a pipe whose write end is all the kernel holds; this process appends it to ``audit_log``,
    which the kernel cannot open, and logs a pipe closed while the kernel still runs."""

    AUDIT_FD = "{audit_fd}"  # in jail_args, replaced by the pipe's descriptor at launch

    jail_args = List(Unicode(), help="arguments for python -m gpulab.confine.jail").tag(config=True)
    kernel_prefix = List(Unicode(), help="command put before the jail (setpriv ...)").tag(config=True)
    kernel_uid = Integer(-1, help="the kernel's uid: its folder and connection file are handed to it "
                                  "(-1: the kernel keeps nbgrader's uid)").tag(config=True)
    audit_log = Unicode("", help="where the jail's audit pipe is written (JSON lines)").tag(config=True)
    client_class = DottedObjectName("gpulab.autograde.execute.kernel.CappedKernelClient")
    client_factory = Type(CappedKernelClient, klass="jupyter_client.asynchronous.AsyncKernelClient")

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if self.kernel_uid >= 0:  # called once the connection file is written, before the launch
            cwd = (self._launch_args or {}).get("cwd")
            isolation.give(self.kernel_uid, self.connection_file, *([cwd] if cwd else []))
        if not self.jail_args:
            return [*self.kernel_prefix, *cmd]
        if len(cmd) >= 3 and cmd[1] == "-m":  # a Python kernel: the jail imports and runs the module
            return [*self.kernel_prefix, cmd[0], "-m", "gpulab.confine.jail", *self.jail_args, "--", *cmd[1:]]
        return [*self.kernel_prefix, sys.executable, "-m", "gpulab.confine.jail", *self.jail_args, "--", *cmd]

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: object) -> None:
        if not self.audit_log or self.AUDIT_FD not in kernel_cmd:
            await super()._async_launch_kernel(kernel_cmd, **kw)
            return
        read_end, write_end = os.pipe()
        cmd = [str(write_end) if a == self.AUDIT_FD else a for a in kernel_cmd]
        try:
            await super()._async_launch_kernel(cmd, pass_fds=(write_end,), **kw)
        finally:
            os.close(write_end)
        threading.Thread(target=self._copy_audit, args=(read_end,), daemon=True, name="audit-log").start()

    def _copy_audit(self, read_end: int) -> None:
        """Append what the kernel's jail writes to the pipe to :attr:`audit_log`, until it closes."""
        with os.fdopen(read_end, "rb") as pipe, open(self.audit_log, "ab") as log:
            for line in pipe:
                log.write(line[:65536].rstrip(b"\n") + b"\n")
                log.flush()
            process = getattr(self.provisioner, "process", None)
            if process is not None and process.poll() is None:  # a kernel being stopped closes it too: wait
                try:
                    process.wait(timeout=2)
                except Exception:  # still running (TimeoutExpired), or already reaped elsewhere
                    pass
            if process is not None and process.poll() is None:  # the kernel lives on without its log
                log.write((json.dumps({"event": "audit-closed"}) + "\n").encode())


def kill_kernel(km: object) -> None:
    """Kill a kernel and every process it started (it ignored the time limit and an interrupt)."""
    import psutil

    pid = getattr(getattr(km, "provisioner", None), "pid", None)
    if pid is None:
        return
    try:
        root = psutil.Process(pid)
        for proc in root.children(recursive=True) + [root]:
            proc.kill()
    except psutil.NoSuchProcess:
        pass

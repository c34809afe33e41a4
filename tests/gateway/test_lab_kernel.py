"""The owner runs code in a kernel over the websocket, through the gateway, as JupyterLab does."""

import json
import uuid
from datetime import UTC, datetime

import pytest
import websocket
from jupyter_server.services.kernels.connection.base import deserialize_msg_from_ws_v1, serialize_msg_to_ws_v1

from .helpers import browser, lab_url, session_cookie_for, ws_connect

pytestmark = pytest.mark.django_db(transaction=True)

KERNEL_PROTOCOL = "v1.kernel.websocket.jupyter.org"


def execute_request(code: str) -> dict:
    return {
        "header": {
            "msg_id": uuid.uuid4().hex,
            "username": "alice",
            "session": uuid.uuid4().hex,
            "msg_type": "execute_request",
            "version": "5.3",
            "date": datetime.now(UTC).isoformat(),
        },
        "parent_header": {},
        "metadata": {},
        "content": {
            "code": code,
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
        "channel": "shell",
        "buffers": [],
    }


@pytest.fixture
def alice_kernel(client, alice, alice_lab, portal_server):
    """(session cookie, kernel id) for a kernel Alice started through the gateway."""
    session_key = session_cookie_for(client, alice)
    with browser(portal_server, session_key) as alice_browser:
        created = alice_browser.post(lab_url(alice_lab.id, "api/kernels"), json={"name": "python3"})
        assert created.status_code == 201, created.text
        kernel_id = created.json()["id"]
        yield session_key, kernel_id
        alice_browser.delete(lab_url(alice_lab.id, f"api/kernels/{kernel_id}"))


def stream_output(ws, parent_msg_id: str, *, decode) -> str:
    """Reads kernel messages until the execution `parent_msg_id` goes idle; returns its stdout."""
    output = ""
    for _ in range(200):
        msg = decode(ws)
        if msg.get("parent_header", {}).get("msg_id") != parent_msg_id:
            continue
        if msg["msg_type"] == "stream":
            output += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return output
    raise AssertionError("the kernel never went idle")


def test_it_runs_code_in_a_kernel_over_the_websocket(alice_lab, alice_kernel, portal_server):
    session_key, kernel_id = alice_kernel
    ws = ws_connect(portal_server, lab_url(alice_lab.id, f"api/kernels/{kernel_id}/channels"), session_key)
    try:
        request = execute_request("print(6*7)")
        ws.send(json.dumps(request))
        output = stream_output(ws, request["header"]["msg_id"], decode=lambda w: json.loads(w.recv()))
    finally:
        ws.close()

    assert output == "42\n"


def test_it_passes_the_subprotocol_and_binary_frames(alice_lab, alice_kernel, portal_server):
    # JupyterLab 4 speaks the v1 kernel protocol: binary frames, negotiated as a subprotocol.
    session_key, kernel_id = alice_kernel
    ws = ws_connect(
        portal_server,
        lab_url(alice_lab.id, f"api/kernels/{kernel_id}/channels"),
        session_key,
        subprotocols=[KERNEL_PROTOCOL],
    )

    def decode(w):
        opcode, data = w.recv_data()
        assert opcode == websocket.ABNF.OPCODE_BINARY
        _channel, parts = deserialize_msg_from_ws_v1(data)
        header, parent, _metadata, content = (json.loads(p) for p in parts[:4])
        return {"msg_type": header["msg_type"], "parent_header": parent, "content": content}

    try:
        assert ws.subprotocol == KERNEL_PROTOCOL
        request = execute_request("print(sum(range(10)))")
        parts = [
            json.dumps(request[key]).encode() for key in ("header", "parent_header", "metadata", "content")
        ]
        ws.send_binary(serialize_msg_to_ws_v1(parts, "shell"))
        output = stream_output(ws, request["header"]["msg_id"], decode=decode)
    finally:
        ws.close()

    assert output == "45\n"


def test_it_relays_jupyter_refusing_an_unknown_kernel(client, alice, alice_lab, portal_server):
    session_key = session_cookie_for(client, alice)
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        ws_connect(portal_server, lab_url(alice_lab.id, f"api/kernels/{uuid.uuid4()}/channels"), session_key)

    assert refused.value.status_code == 404

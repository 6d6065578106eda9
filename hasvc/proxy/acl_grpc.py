"""``hasvc proxy --acl``: the gRPC side of client authentication (the rules are ``hasvc/proxy/acl.py``).

:class:`AclInterceptor` sits in front of the servicer (``hasvc/proxy/server.py``): every call's
MQv2-HMAC-SHA1 signature is checked, and the calls that name a topic or a group are authorized,
before the servicer sees them; a refused call is answered with its method's response.
"""

from __future__ import annotations

import logging
import time

import grpc
import grpc.aio

from hasvc.proxy import gateway
from hasvc.proxy.pb import Code, service, status

log = logging.getLogger("hasvc.proxy")
# What each call is about, for the ACL: (actions any of which permits it, topic, group) per resource.
# QueryRoute serves producers and consumers alike; the other calls not named need a valid signature only.
def _acl_resources(method: str, request) -> list[tuple[tuple[str, ...], str | None, str | None]] | None:
    if method == "SendMessage":
        return [(("pub",), gateway.wrap_topic(message.topic), None) for message in request.messages]
    if method == "QueryRoute":
        return [(("pub", "sub"), gateway.wrap_topic(request.topic), None)]
    if method == "ReceiveMessage":
        return [(("sub",), gateway.wrap_topic(request.message_queue.topic), gateway.wrap_topic(request.group))]
    if method in ("QueryAssignment", "AckMessage", "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue"):
        return [(("sub",), gateway.wrap_topic(request.topic), gateway.wrap_topic(request.group))]
    return None


# Refusals logged one line each for the first this many (reason, access key) pairs; the rest are
# counted only (hasvc_proxy_acl_refused): a client retrying with a wrong key must not flood the log.
ACL_LOGGED_REFUSALS_MAX = 1024


class AclInterceptor(grpc.aio.ServerInterceptor):
    """``--acl``: every call is authenticated (its MQv2-HMAC-SHA1 signature) and the calls that
    name a topic or group are authorized (hasvc/proxy/acl.py) before the servicer sees them. A
    refused call is answered with its method's response and status UNAUTHORIZED (not signed,
    unknown key, bad signature, time outside the window) or FORBIDDEN (not permitted), which the
    official clients raise as UnauthorizedException / ForbiddenException; nothing reaches the
    gateway, so nothing is stored."""

    def __init__(self, acl_rules) -> None:
        from hasvc.proxy import acl

        self.acl = acl_rules
        self.refused = dict.fromkeys(acl.REASONS, 0)  # reason -> calls refused (metrics)
        self.on_answered = None  # Servicer._answered, once the servicer exists
        self._logged: set[tuple[str, str]] = set()

    async def intercept_service(self, continuation, handler_call_details):
        from hasvc.proxy.acl import AUTHORIZATION_HEADER, DATE_TIME_HEADER, Refusal

        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method.rpartition("/")[2]
        authorization = date_time = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == AUTHORIZATION_HEADER:
                authorization = value
            elif key == DATE_TIME_HEADER:
                date_time = value
        verdict = self.acl.authenticate(authorization, date_time, now=time.time())
        if isinstance(verdict, Refusal):
            return self._refusing(handler, method, verdict)
        if method not in ("SendMessage", "QueryRoute", "ReceiveMessage", "QueryAssignment", "AckMessage",
                          "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue"):  # fmt: skip
            return handler
        return self._authorizing(handler, method, verdict)

    def _refusal(self, method: str, refusal):
        code = Code.FORBIDDEN if refusal.authenticated else Code.UNAUTHORIZED
        self.refused[refusal.reason] += 1
        if self.on_answered is not None:
            self.on_answered(method, code)
        key = (refusal.reason, refusal.message[:80])
        if key not in self._logged and len(self._logged) < ACL_LOGGED_REFUSALS_MAX:
            self._logged.add(key)
            log.warning("acl: %s refused (%s): %s", method, refusal.reason, refusal.message)
        response_class = service.TelemetryCommand if method == "Telemetry" else getattr(service, f"{method}Response")
        return response_class(status=status(code, refusal.message))

    def _refusing(self, handler, method: str, refusal):
        """A handler that answers the call with the refusal, whatever its shape."""
        options = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        if handler.unary_unary is not None:
            async def unary(request, context):
                return self._refusal(method, refusal)

            return grpc.unary_unary_rpc_method_handler(unary, **options)
        if handler.unary_stream is not None:
            async def unary_stream(request, context):
                yield self._refusal(method, refusal)

            return grpc.unary_stream_rpc_method_handler(unary_stream, **options)
        if handler.stream_stream is not None:
            async def stream_stream(request_iterator, context):
                yield self._refusal(method, refusal)

            return grpc.stream_stream_rpc_method_handler(stream_stream, **options)

        async def stream_unary(request_iterator, context):
            return self._refusal(method, refusal)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **options)

    def _authorizing(self, handler, method: str, account):
        """``handler`` behind the account's permissions for what the request names."""
        options = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)

        def refusal_of(request):
            for actions, topic, group in _acl_resources(method, request) or ():
                refusal = self.acl.authorize(account, actions, topic=topic, group=group)
                if refusal is not None:
                    return refusal
            return None

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request, context):
                refusal = refusal_of(request)
                if refusal is not None:
                    return self._refusal(method, refusal)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(unary, **options)
        inner_stream = handler.unary_stream
        assert inner_stream is not None, f"{method}: a streaming request names no resource to authorize"

        async def unary_stream(request, context):
            refusal = refusal_of(request)
            if refusal is not None:
                yield self._refusal(method, refusal)
                return
            async for response in inner_stream(request, context):
                yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, **options)

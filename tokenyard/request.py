"""`tokenyard request "PROMPT"`: send one request over NATS and print its stream as it comes.

What any NATS client does, in a few lines (shared/client.py): subscribe to a fresh inbox,
publish the request on `llm.v1.submit` with that inbox as the reply subject, then read the
request's events from the inbox — `accepted`, `chunk` 0, 1, 2 …, and `finished` (or
`rejected` / `error`). The text goes to stdout as it arrives; a summary line, or the reason of
a refusal, to stderr. `--events` prints every event as one JSON line instead, as the wire
carries them with header `Content-Type: application/json`.
"""

from __future__ import annotations

import asyncio
import sys

import msgspec

from tokenyard.shared import config, schemas


def register(sub) -> None:
    p = sub.add_parser(
        "request", help="send one request over NATS and print its stream",
        description="Send one request to a running fleet over NATS (llm.v1.submit, replies on an inbox) and "
        "print the generated text as it streams in.",
    )
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--nats", default=config.nats_url_from_env(), help="NATS server URL (env TOKENYARD_NATS_URL)")
    p.add_argument("--model", default=config.DEFAULT_MODEL, help="model name")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens to generate at most")
    p.add_argument("--chat", action="store_true", help="send the prompt as one user message (chat completion)")
    p.add_argument("--tier", choices=("P0", "P1", "P2", "P3"), default=None,
                   help="service class asked for (P0 first; capped per tenant; default: the fleet's)")
    p.add_argument("--events", action="store_true", help="print every event as a JSON line instead of the text")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the next event")
    p.set_defaults(func=main)


def build_request(args) -> schemas.GenerateRequest:
    if args.max_tokens < 1:
        raise ValueError("--max-tokens must be at least 1")
    if args.chat:
        return schemas.GenerateRequest(model=args.model, messages=[schemas.ChatMessage(role="user", content=args.prompt)],
                                       max_tokens=args.max_tokens)
    return schemas.GenerateRequest(model=args.model, prompt=args.prompt, max_tokens=args.max_tokens)


def summary(event: schemas.Finished) -> str:
    u = event.usage
    ttft = f" · first token after {event.ttft_ms:.1f} ms" if event.ttft_ms is not None else ""
    return (f"[{event.finish_reason}: {u.completion_tokens} tokens for a {u.prompt_tokens}-token prompt "
            f"({u.cached_tokens} cached) on worker {event.worker_id or '?'}{ttft}]")


async def run(args, out=sys.stdout, err=sys.stderr) -> int:
    from tokenyard.shared.client import TokenyardClient

    request = build_request(args)
    headers = {"x-request-tier": args.tier} if args.tier else None
    rc = 1
    async with await TokenyardClient.connect(args.nats, "tokenyard-request") as client:
        # The stream ends by itself after its terminal event: read it to the end, so it closes
        # its inbox before the connection does.
        async for event in client.stream(request, headers=headers, idle_timeout_s=args.timeout):
            if args.events:
                out.write(msgspec.json.encode(event).decode() + "\n")
                out.flush()
            match event:
                case schemas.Chunk() if not args.events:
                    out.write(event.text)
                    out.flush()
                case schemas.Finished():
                    if not args.events:
                        out.write("\n")
                        err.write(summary(event) + "\n")
                    rc = 0
                case schemas.Rejected() | schemas.Error():
                    err.write(f"tokenyard request: {event.status} {event.code}: {event.message}\n")
    return rc


def main(args) -> int:
    try:
        return asyncio.run(run(args))
    except ValueError as e:
        print(f"tokenyard request: error: {e}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError) as e:  # "cannot reach NATS", no event within --timeout
        print(f"tokenyard request: error: {e or 'no event within --timeout'}", file=sys.stderr)
        return 1

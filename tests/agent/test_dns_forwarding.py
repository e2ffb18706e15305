"""What of a sandbox's DNS message reaches the host's resolver: its question and id, nothing else."""

from __future__ import annotations

from dnslib import EDNS0, RR, DNSRecord

from corral.agent.dns import _forwarded


def test_only_the_question_and_id_of_a_sandbox_s_query_are_forwarded() -> None:
    query = DNSRecord.question("pypi.org", "A")
    query.add_answer(*RR.fromZone("smuggled.example. 60 A 10.0.0.1"))
    query.add_auth(*RR.fromZone("smuggled.example. 60 NS ns.example."))
    query.add_ar(EDNS0(opts=[]))
    query.header.cd = 1  # a flag the sandbox set
    sent = DNSRecord.parse(_forwarded(DNSRecord.parse(query.pack())))
    assert sent.header.id == query.header.id and sent.q == query.q
    assert (sent.rr, sent.auth, sent.ar) == ([], [], [])
    assert not sent.header.cd and sent.header.rd

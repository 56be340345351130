# moto's SQS race, forced: a delete has filtered its queue's message list and
# is about to store the result when a send appends to the list. Prints
# "kept" if the sent message is in the queue afterwards, "lost" if not.
# `chaos/tests/it/brokers.rs` runs it with and without haunt's patch
# (chaos/src/systems/moto/sitecustomize.py on PYTHONPATH).
import linecache
import sys
import threading

from moto.sqs.models import sqs_backends

backend = sqs_backends["123456789012"]["us-east-1"]
queue = backend.create_queue("race")
backend.send_message("race", "old")
victim = backend.receive_message("race", 1, 0, 30)[0]
at_store, sent = threading.Event(), threading.Event()


def stop_before_the_store(frame, event, arg):
    """A trace of the deleting thread: it waits at the line that stores the
    filtered list until the send is done (or a second has passed: with the
    patch, the send waits for the delete's lock instead)."""
    if event == "call":
        return stop_before_the_store if frame.f_code.co_name == "delete_message" else None
    if event == "line":
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        if line == "self._messages = new_messages":
            at_store.set()
            sent.wait(1.0)
    return stop_before_the_store


def delete():
    sys.settrace(stop_before_the_store)
    backend.delete_message("race", victim.receipt_handle)
    sys.settrace(None)


def send():
    if not at_store.wait(5.0):
        sys.exit("the delete never reached its store: this moto deletes differently")
    backend.send_message("race", "new")
    sent.set()


threads = [threading.Thread(target=delete), threading.Thread(target=send)]
for t in threads:
    t.start()
for t in threads:
    t.join()
bodies = [m.body for m in queue._messages]
print("kept" if bodies == ["new"] else "lost", bodies)

# moto's FIFO redelivery, forced: a group's batch received with a 1 s
# visibility timeout and left to expire comes back in order with the patch
# ("fifo in order"), last message first without it ("fifo last first").
fifo = backend.create_queue("race.fifo", FifoQueue="true", ContentBasedDeduplication="false")
for i in range(3):
    backend.send_message("race.fifo", f"m{i}", group_id="g", deduplication_id=f"d{i}")
backend.receive_message("race.fifo", 10, 0, 1)
import time

time.sleep(1.2)
again = [m.body for m in backend.receive_message("race.fifo", 1, 0, 30)]
print("fifo in order" if again == ["m0"] else "fifo last first", again)

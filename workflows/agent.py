"""AgentTaskWorkflow: intent -> plan -> ReAct loop -> summary, every side effect an activity.

Pure orchestration: decisions live in `workflows.logic`; this class waits, calls
activities and applies their results to one serializable `AgentState`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal, NoReturn

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

# Models and the static tool registry are plain data; passed through so the sandbox
# does not re-import pydantic for every workflow run.
with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls, visibility
    from refloop.contract.activity_io import (
        ActInput,
        ActResult,
        ApprovalDecision,
        ClassifyIntentInput,
        KeepRecordsInput,
        MakePlanInput,
        ReadToolsInput,
        RunToolInput,
        SummarizeInput,
        ToolResult,
    )
    from refloop.contract.checkpoints import (
        FORK_TAKEN_SIGNAL,
        REWIND_UPDATE,
        ForkOrigin,
        ForkTaken,
        RewindRequest,
        Rewound,
    )
    from refloop.contract.handover import (
        HAND_OVER_UPDATE,
        HANDED_OVER,
        TAKE_OVER_SIGNAL,
        HandedOver,
        HandOverRequest,
        TakeOver,
    )
    from refloop.contract.hosts import CLAIM_UPDATE, CallClaim, HostMove
    from refloop.contract.messages import ChatMessage, Plan, ToolCall
    from refloop.contract.task import (
        MODEL_WAIT_SIGNAL,
        Event,
        ModelWaitReport,
        TaskInput,
        TaskProgress,
        TaskResult,
    )
    from refloop.contract.text import task_keywords
    from refloop.contract.tool_catalog import tool_specs
    from refloop.contract.tool_properties import not_run_again
    from refloop.workflows.state import AgentState, TurnState

from refloop.contract.policies import (
    CARRIED_EVENTS,
    KEPT_CLAIMS,
    MAX_REPLANS,
    TOOL_RESULT_CHARS,
    VIOLATIONS_CARRIED,
)
from refloop.workflows import completeness_logic, logic, triggers
from refloop.workflows.agent_base import TaskFailed, describe_failure
from refloop.workflows.approval_phase import ApprovalPhase, ApprovalUnanswered, with_edit_note
from refloop.workflows.budget_phase import BudgetPhase, BudgetWaitExpired
from refloop.workflows.calls import Calls, InterruptNow
from refloop.workflows.compact_phase import CompactPhase
from refloop.workflows.completeness_phase import CompletenessPhase
from refloop.workflows.handover_phase import HandOverPhase
from refloop.workflows.host_phase import HostPhase
from refloop.workflows.mcp_phase import McpPhase, with_mcp_reads
from refloop.workflows.model_phase import ModelPhase, activity_stop_reason
from refloop.workflows.review_phase import QualityReviewPhase
from refloop.workflows.rewind_phase import RewindPhase
from refloop.workflows.visibility_phase import TaskVisibility
from refloop.workflows.workspace_phase import WorkspacePhase


# The phases stay mixins of one class: they share one state object that crosses
# continue-as-new whole, and Temporal registers a workflow's queries, updates and signals
# only on its class, whose handlers each phase serves. What they must not share implicitly
# is explicit: every activity and child goes through `self.activities`, built here with
# this workflow as its router (the host phase), never looked up at call time.
@workflow.defn(name="AgentTaskWorkflow")
class AgentTaskWorkflow(QualityReviewPhase, CompletenessPhase, ApprovalPhase, RewindPhase,
                        WorkspacePhase, McpPhase, HostPhase, ModelPhase, HandOverPhase,
                        BudgetPhase, CompactPhase):
    @workflow.init
    def __init__(self, inp: TaskInput) -> None:
        self.activities = Calls(router=self)
        self.visibility = TaskVisibility()
        if inp.resume_state is not None:  # continued-as-new: the same task, a fresh history
            self.state = AgentState.model_validate(inp.resume_state)
            # handed over: parked until another build takes it over (HandOverPhase)
            self.state.input = self.state.input.model_copy(
                update={"handed_over": inp.handed_over})
        else:
            self.state = AgentState(input=inp,
                                    task_id=inp.task_id or workflow.info().workflow_id)
            self.state.calls.changes = {}  # counted from the first call on
        self._adopt_tools()
        self.keywords = task_keywords(inp.task)
        if self.state.mcp.tools:  # continued-as-new: listed by an earlier run
            self._adopt_mcp_tools()

    def _adopt_tools(self) -> None:
        builtins = self._builtin_tools()
        self.tools = tool_specs([*builtins, logic.COMPLETE_STEP])
        self.tool_names = [spec.name for spec in self.tools]
        self.edit_tools = {name for name, properties in builtins.items() if properties.journaled}

    async def _fix_tools(self) -> None:
        """The tools of this task, read once and kept in its state: replay and later runs
        use them whatever the code's catalogue has become."""
        if self.state.tools is not None:
            return
        snapshot = await self.activities.call(activity_calls.READ_TOOL_CATALOG, ReadToolsInput(),
                                       summary="tool catalogue")
        self.state.tools = snapshot.tools
        self._adopt_tools()

    # ------------------------------------------------------------ queries

    @workflow.query(description="The task's events after sequence number `after_seq` "
                    "(default 0: all): plan, steps, tool calls and results, reflections.")
    def events(self, after_seq: int = 0) -> list[Event]:
        return [event for event in self.state.events if event.seq > after_seq]

    @workflow.query(description="Status, current plan step, plan, stats and event count.")
    def progress(self) -> TaskProgress:
        return TaskProgress(
            status=self._visible_status(),  # waiting_approval while a call waits
            current_step=self._current_step(),
            plan=self.state.planning.plan,
            stats=self.state.stats,
            event_count=self.state.last_seq,
            budget=self._budget() if self._limited() else None,
        )

    # ------------------------------------------------------------ updates

    @workflow.update(description='Approve or reject a tool call waiting for approval: '
                     '{"call_id": "<iteration>.<index>", "approved": true, "comment": "..."}; '
                     'an approval may carry edited "arguments" (checked like the model\'s).')
    async def decide_approval(self, decision: ApprovalDecision) -> str:
        self._decide(decision)
        return "approved" if decision.approved else "rejected"

    @decide_approval.validator
    def _validate_decision(self, decision: ApprovalDecision) -> None:
        self._refuse_decision(decision)

    @workflow.update(description="Move a task waiting for a host that will never return to "
                     'another: {"host": <that host as GET /hosts lists it>}; it must be live '
                     "and its roots must hold the task's workspace (copied there first).")
    async def move_to_host(self, move: HostMove) -> str:
        self._move_to_host(move)
        return move.host.host_id

    @move_to_host.validator
    def _validate_move(self, move: HostMove) -> None:
        self._refuse_move(move)

    @workflow.update(name=CLAIM_UPDATE, description="From a host's worker, before it runs a "
                     "call the task scheduled while it waited for its host: refused if a move "
                     "took the call back (it does not run then); once accepted, no move is.")
    def claim_call(self, claim: CallClaim) -> str:
        self._claim(claim)
        return claim.activity_id

    @claim_call.validator
    def _validate_claim(self, claim: CallClaim) -> None:
        self._refuse_claim(claim)

    @workflow.update(name=HAND_OVER_UPDATE, description="From `refloop drain`, before the "
                     "workers of `build` stop: continue as new at the next safe point, parked "
                     "until a worker of another build takes the task over.")
    def hand_over(self, request: HandOverRequest) -> str:
        self._hand_over_asked(request)
        return "handing over"

    @hand_over.validator
    def _validate_hand_over(self, request: HandOverRequest) -> None:
        self._refuse_hand_over(request)

    @workflow.update(name=REWIND_UPDATE, description="From `refloop rewind`: put the task "
                     'back to checkpoint `step` of its run ({"step": 2}): its workspace, '
                     "conversation and plan progress together, at its next safe point; "
                     "refused or failed, nothing changes.")
    async def rewind(self, request: RewindRequest) -> Rewound:
        return await self._rewind_asked(request)

    @rewind.validator
    def _validate_rewind(self, request: RewindRequest) -> None:
        self._refuse_rewind(request)

    # ------------------------------------------------------------ signals

    @workflow.signal(name=TAKE_OVER_SIGNAL, description="From a worker of a new build: a "
                     "task handed over by another build goes on.")
    def take_over(self, take: TakeOver) -> None:
        self._take_over_asked(take)

    # A report still being recorded when the task ends is abandoned: the task's final
    # record says what it ended as (a call that gives up tells its task, then fails it).
    @workflow.signal(name=MODEL_WAIT_SIGNAL, description="From a model call: it waits for "
                     "its endpoint (the task is waiting_for_model), or the endpoint is back.",
                     unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON)
    async def model_wait(self, report: ModelWaitReport) -> None:
        await self._model_wait_reported(report)

    @workflow.signal(name=FORK_TAKEN_SIGNAL, description="From `refloop fork`: a task was "
                     "forked from one of this task's steps.")
    def fork_taken(self, fork: ForkTaken) -> None:
        self._emit("forked", {"task_id": fork.task_id, "step": fork.step})

    # ------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: TaskInput) -> TaskResult:
        try:
            await self._wait_for_a_new_build()  # a handed-over run: first, nothing recorded
            await self._fix_tools()
            if inp.resume_state is None:
                if self._forking() is None:  # a fork's, once its workspace is restored
                    self._begin_describing()
                await self._record("running", input=inp.model_dump(mode="json"))
            self._show()
            return await self._run(inp)
        except BudgetWaitExpired as unraised:  # nobody raised the limit: not done
            return await self._finish_incomplete([unraised.reason], unraised.stop_reason)
        except asyncio.CancelledError:
            # Cancelled by a user (API/CLI): say so in the events and the DB, then stop.
            self._stop_indexing()
            self.state.status = "cancelled"
            self._emit("failed", {"stop_reason": "cancelled", "error": "cancelled by request"})
            result = self._result("failed", "cancelled", "cancelled by request")
            self._show("cancelled")
            await self._record("cancelled", result=result.model_dump(mode="json"))
            raise

    async def _run(self, inp: TaskInput) -> TaskResult:
        try:
            await self._settle_model_route()
            if inp.resume_state is None:
                await self._check_host()
                await self._list_mcp_tools()
            if inp.resume_state is not None:  # intent and plan settled by an earlier run
                self._resume_indexing()
            elif (fork := self._forking()) is not None:
                await self._adopt_fork(fork)
            elif inp.preset_plan is not None:  # a supplement child: planned by its parent
                self._adopt_plan(inp.preset_plan)
            else:
                await self._classify_intent()
                if logic.should_plan(self.state.planning.intent, inp.enable_planning):
                    await self._plan_or_answer_directly()
            await self._react_loop()
        except TaskFailed as failure:
            return await self._finish_failed(failure.stop_reason, failure.message)
        except ApprovalUnanswered as unanswered:  # nobody decided: not done, never completed
            return await self._finish_incomplete([unanswered.missing], "approval_timeout")
        except InterruptNow:  # a waiting call was taken back for a hand-over
            if self.state.calls.turn is None:  # at the turn's model call: it is asked again
                self.state.stats = self.state.stats.model_copy(
                    update={"iterations": self.state.stats.iterations - 1})
            await self._continue_handed_over()
        except ActivityError as err:
            self._account_failure(err)
            return await self._finish_failed(activity_stop_reason(err),
                                             describe_failure(err))
        await self._reflect_on_completeness()
        if not inp.is_supplement:
            await self._summarize()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return await self._finish_completed()

    async def _adopt_fork(self, fork: ForkOrigin) -> None:
        """A fork goes on from the original's step: its workspace, plan, progress and
        conversation as they were there (the new instruction is the conversation's last
        turn)."""
        await self._restore_fork(fork)
        planning, calls = self.state.planning, self.state.calls
        planning.completed_steps = list(fork.completed_steps)
        calls.edits_ok = fork.changes
        if calls.changes is not None and fork.changes:
            calls.changes["forked"] = fork.changes
        if fork.plan is not None:
            self._adopt_plan(fork.plan)
        self.state.conversation.ref = fork.conversation_ref
        await self._adopt_workspace_context(self.tool_names)
        if fork.conversation_ref is None:  # forked before any model turn: start afresh
            self._start_conversation()

    async def _classify_intent(self) -> None:
        try:
            result = await self.activities.call(
                activity_calls.CLASSIFY_INTENT,
                ClassifyIntentInput(task=self.state.input.task, model=self.state.input.model,
                                    endpoint=self.state.input.endpoint),
                summary="intent",
            )
        except ActivityError as err:
            self._account_failure(err)
            # The gate only decides whether to plan; failing open keeps the task going.
            self._emit(
                "intent", {"intent": None, "error": describe_failure(err), "fail_open": True}
            )
            return
        self._account(result.usage)
        self.state.planning.intent = result.intent
        self._emit("intent", result.intent.model_dump(mode="json"))
        self._show()

    async def _plan_or_answer_directly(self) -> None:
        """A question or chat line that cannot be planned is answered without tools;
        only a task that needs tools fails on a bad plan."""
        reason: str | None  # why the plan is skipped, if it is
        try:
            await self._make_plan()
        except (TaskFailed, ActivityError) as err:
            if not logic.is_question(self.state.input.task):
                raise
            if isinstance(err, ActivityError):
                self._account_failure(err)
            reason = err.message if isinstance(err, TaskFailed) else describe_failure(err)
            self.state.planning.direct_answer = True
            self._emit("plan_skipped", {"reason": reason[:500], "direct_answer": True})
            return
        planning = self.state.planning
        reason = logic.question_planned_as_edits(self.state.input.task, planning.intent,
                                                 planning.plan, self.edit_tools)
        if reason:
            planning.plan, planning.direct_answer = None, True
            self._emit("plan_skipped", {"reason": reason, "direct_answer": True})

    async def _make_plan(self) -> None:
        feedback = None
        for attempt in range(MAX_REPLANS + 1):
            result = await self.activities.call(
                activity_calls.MAKE_PLAN,
                MakePlanInput(
                    task=self.state.input.task,
                    tool_names=self.tool_names,
                    model=self.state.input.model,
                    endpoint=self.state.input.endpoint,
                    feedback=feedback,
                    mcp_tools_ref=self.state.mcp.specs_ref,
                ),
                summary=f"plan · attempt {attempt + 1}" if attempt else "plan",
            )
            self._account(result.usage)
            violations = logic.validate_plan(
                result.plan, [*self._builtin_tools(), *self.state.mcp.tools], result.constraints)
            if not violations:
                self.state.planning.constraints = with_mcp_reads(result.constraints,
                                                        self._mcp_read_tools())
                if result.constraints and result.constraints.task_type:
                    self._emit("constraints", result.constraints.model_dump(mode="json"))
                self._adopt_plan(result.plan)
                return
            self._emit("plan_rejected", {"attempt": attempt + 1, "violations": violations})
            feedback = "\n".join(violations)
        raise TaskFailed(
            "invalid_plan", f"the plan stayed invalid after {MAX_REPLANS} re-plans: {feedback}"
        )

    def _adopt_plan(self, plan: Plan) -> None:
        self.state.planning.plan = plan
        self._emit("plan", plan.model_dump(mode="json"))
        self._emit_step()
        self._show()

    def _start_conversation(self) -> None:
        inp = self.state.input
        if self.state.planning.direct_answer:
            system = logic.DIRECT_ANSWER_PROMPT
        else:
            system = logic.system_prompt(inp.system_prompt, self.tools, inp.workspace,
                                         self.state.workspace.context)
        self.state.conversation.unsent_turns = [
            ChatMessage(role="system", content=system),
            ChatMessage(
                role="user",
                content=logic.task_message(inp.task, self.state.planning.plan, inp.prior_context),
            ),
        ]

    async def _react_loop(self) -> None:
        """Act, run the calls, reflect; until a final answer, the budget, or the cap."""
        conversation = self.state.conversation
        if conversation.ref is None and not conversation.unsent_turns:
            await self._adopt_workspace_context(self.tool_names)
            self._start_conversation()
        self._in_loop = True
        try:
            while not await self._loop_until_rewound():
                pass
        finally:
            self._in_loop = False

    async def _loop_until_rewound(self) -> bool:
        """The loop, until it ends (True) or stops for a rewind (False: it goes on from the
        point put back, or from where it stopped if the rewind failed)."""
        try:
            await self._loop()
            ended = True
        except InterruptNow:
            if not self.rewind_due():
                raise  # a hand-over
            ended = False
        if not self.rewind_due():
            return True
        if not ended and self.state.calls.turn is None:  # stopped at the turn's model call
            self.state.stats = self.state.stats.model_copy(
                update={"iterations": self.state.stats.iterations - 1})
        rewound = await self._rewind_now()
        return ended and not rewound

    async def _loop(self) -> None:
        inp, conversation = self.state.input, self.state.conversation
        if self.state.calls.turn is not None:  # handed over mid-turn: its calls go on
            await self._finish_turn(self.state.calls.turn)
        # A continued run resumes after the last completed iteration.
        for iteration in range(self.state.stats.iterations + 1, inp.max_iterations + 1):
            self.state.stats = self.state.stats.model_copy(update={"iterations": iteration})
            if self.rewind_due():
                raise InterruptNow()
            act = await self._act(iteration)
            if act.abnormal:
                self._reject_abnormal_output(act, iteration)
                continue
            structured = bool(act.tool_calls)  # not parsed out of the text
            calls = act.tool_calls if structured else self._text_tool_calls(act, iteration)
            if not calls:
                conversation.answer = act.content or ""
                self._append(ChatMessage(role="assistant", content=conversation.answer))
                return
            self._append(logic.assistant_tool_message(act.content, calls, structured))
            await self._finish_turn(TurnState(iteration=iteration, structured=structured,
                                              calls=calls))
            await self._maybe_continue_as_new()
        raise TaskFailed(
            "max_iterations",
            f"stopped: max iterations ({inp.max_iterations}) reached without a final answer",
        )

    async def _act(self, iteration: int) -> ActResult:
        """One model turn: the unsent turns go out, the stored conversation grows."""
        inp, conversation = self.state.input, self.state.conversation
        direct = self.state.planning.direct_answer
        tool_names, every_tool = logic.act_tools([] if direct else self.tool_names)
        act = await self.activities.call(
            activity_calls.ACT,
            ActInput(
                messages=conversation.unsent_turns,
                conversation_ref=conversation.ref,
                max_history_messages=inp.max_history_messages,
                tool_names=tool_names, every_tool=every_tool,
                mcp_tools_ref=None if direct else self.state.mcp.specs_ref,
                model=inp.model, endpoint=inp.endpoint,
                parallel_tool_calls=False if inp.enable_quality_review else None,
            ),
            summary=self._act_summary(iteration),
        )
        self._account(act.usage)
        conversation.ref, conversation.unsent_turns = act.conversation_ref, []
        await self._keep_within_window(act)  # CompactPhase: past a threshold, a summary
        return act

    def _reject_abnormal_output(self, act: ActResult, iteration: int) -> None:
        self._emit("abnormal_output", {"iteration": iteration, "reason": act.abnormal})
        self._append(ChatMessage(role="assistant", content=act.content or ""))
        self._append(ChatMessage(role="user",
                                 content=logic.abnormal_output_message(act.abnormal or "")))

    def _text_tool_calls(self, act: ActResult, iteration: int) -> list[ToolCall]:
        """A tool call a model without structured tool calls wrote as text."""
        if self.state.planning.direct_answer:
            return []
        parsed = logic.parse_text_tool_call(act.content, f"text_{iteration}", every_form=True)
        return [parsed] if parsed else []

    async def _finish_turn(self, turn: TurnState) -> None:
        """Run the turn's calls from `turn.next_index` on, then reflect on the turn."""
        self.state.calls.turn = turn
        reflection = await self._run_calls(turn)
        await self._keep_records()
        # One injection point for review-driven and early reflection (no duplicates).
        message = triggers.guidance(self._fire_triggers(turn.iteration), reflection)
        if message:
            self._append(ChatMessage(role="user", content=message))
        self.state.calls.turn = None

    async def _run_calls(self, turn: TurnState) -> str | None:
        """Run the turn's calls one at a time (with review on, each edit is reviewed before
        the next call); their results go back to the model. Returns the review reflection.
        The turn in the state says how far it got (a hand-over goes on from there)."""
        for index in range(turn.next_index, len(turn.calls)):
            # as it ran: a person may have edited its arguments when approving it
            call, result = await self._run_tool_call(turn.calls[index], turn.iteration, index)
            text = logic.format_tool_result(call.name, result, TOOL_RESULT_CHARS)
            text += await self._review_feedback(call, result, turn.reviews)
            self._append(logic.tool_result_message(call, turn.structured, text))
            turn.next_index = index + 1
            self._keep_rewind_point(turn)
        return self._quality_reflection(turn.reviews)

    def _fire_triggers(self, iteration: int) -> list[triggers.Trigger]:
        inp, state = self.state.input, self.state
        planning, calls = state.planning, state.calls
        fired, calls.triggers = triggers.evaluate(
            calls.loop_records, iteration, inp.max_iterations,
            logic.current_step(planning.plan, planning.completed_steps), planning.step_started,
            len(planning.plan.steps) if planning.plan else 0, len(planning.completed_steps),
            inp.triggers, calls.triggers,
        )
        for trigger in fired:
            self._emit("reflection", {"trigger": trigger.name, "evidence": trigger.evidence,
                                      "level": trigger.level, "iteration": iteration})
        return fired

    def _check_constraints(self, call: ToolCall, iteration: int) -> ToolResult | None:
        """Task-type constraints at run time: a forbidden tool is refused unless justified once."""
        calls = self.state.calls
        violation, refusal = logic.check_constraints(
            self.state.planning.constraints, self.state.input.triggers.enforce_constraints,
            call, self._current_step(), iteration, calls.justified_tools)
        if violation is not None:
            calls.violations = logic.carried_violations(calls.violations, violation,
                                                        VIOLATIONS_CARRIED)
            calls.violation_count += 1
            self._emit("tool_violation", violation)
            if violation["justified"]:
                calls.justified_tools.append(call.name)
        return refusal

    async def _keep_records(self) -> None:
        """Past a chunk, the run's tool records go to the blob store and the state keeps
        their reference: a task of any length carries a small state."""
        calls = self.state.calls
        if len(calls.ledger) < completeness_logic.RECORDS_IN_STATE:
            return
        # A chain: the new link names the earlier ones, so the state holds the newest only
        kept = await self.activities.call(
            activity_calls.KEEP_RECORDS,
            KeepRecordsInput(records=calls.ledger, earlier=calls.ledger_refs),
            summary=f"keep {len(calls.ledger)} tool records")
        calls.ledger_refs = [kept.ref]
        calls.kept_calls += len(calls.ledger)
        notes = [r.note for r in calls.ledger if r.tool == logic.COMPLETE_STEP]
        calls.kept_notes = completeness_logic.kept_claims(calls.kept_notes, notes, KEPT_CLAIMS)
        calls.ledger = []

    async def _maybe_continue_as_new(self) -> None:
        """At a step boundary, hand the whole state to a fresh run when history grows long."""
        info, inp = workflow.info(), self.state.input
        if self._hand_over is not None:
            await self._continue_handed_over()
        threshold = inp.continue_as_new_after_events
        if not (info.is_continue_as_new_suggested()
                or (threshold and info.get_current_history_length() > threshold)):
            return
        # a rewind's update waits for the loop: it is done first, the next turn continues
        await workflow.wait_condition(
            lambda: workflow.all_handlers_finished() or self.rewind_due())
        if self.rewind_due():
            return
        self._emit("continued_as_new", {"iteration": self.state.stats.iterations,
                                        "history_length": info.get_current_history_length()})
        self._continue_as_new()

    async def _continue_handed_over(self) -> NoReturn:
        """Continue as new, parked for a worker of another build (HandOverPhase)."""
        request = self._hand_over
        assert request is not None
        for wait in list(self.state.waits):  # the new run waits afresh, if it still must
            self._end_wait(wait)
        self.state.status = HANDED_OVER
        self._emit(HANDED_OVER, {"build": request.build,
                                 "iteration": self.state.stats.iterations})
        self._show()
        await self._record(HANDED_OVER)
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._continue_as_new(HandedOver(from_build=request.build,
                                         at=workflow.now().isoformat()))

    def _continue_as_new(self, handed_over: HandedOver | None = None) -> NoReturn:
        """Hand the whole state to a fresh run. Events keep their sequence numbers; only
        the recent ones travel (payload limits)."""
        self._stop_indexing()
        self.state.events = self._carried_events()
        state = self.state.model_dump(mode="json")
        workflow.continue_as_new(self.state.input.model_copy(
            update={"resume_state": state, "handed_over": handed_over}))

    async def _run_tool_call(self, call: ToolCall, iteration: int, index: int
                             ) -> tuple[ToolCall, ToolResult]:
        self._emit(
            "tool_call",
            {"iteration": iteration, "id": call.id, "tool": call.name, "args": call.arguments},
        )
        step_before = self._current_step()
        call, result = await self._execute_call(call, iteration, index)
        advanced = call.name == logic.COMPLETE_STEP and result.ok
        records = self.state.calls.loop_records
        records.append(triggers.LoopRecord(
            iteration=iteration, step=step_before, tool=call.name,
            args_key=triggers.args_digest(call.arguments),
            anomaly=triggers.anomaly_of(result, self._tool_properties(call.name)),
            advanced=advanced,
        ))
        del records[:-triggers.LOOP_WINDOW]
        if advanced:
            self.state.planning.step_started = iteration + 1
        return call, result

    async def _execute_call(self, call: ToolCall, iteration: int, index: int
                            ) -> tuple[ToolCall, ToolResult]:
        if self.rewind_due():
            raise InterruptNow()
        await self._checkpoint_again()
        self._keep_rewind_point(self.state.calls.turn)
        call, result = await self._dispatch(call, iteration, index)
        checkpoint: dict[str, str] = {}
        if result.checkpoint is not None:  # taken by the call's own activity
            checkpoint = self._adopt_checkpoint(self._call_id(iteration, index),
                                                result.checkpoint)
        elif logic.checkpoint_after(call.name, call.arguments, result.ok,
                                    self._builtin_properties):  # an MCP call's, or a lost one
            checkpoint = await self._checkpoint(self._call_id(iteration, index))
        self._record_call(call, result, iteration, checkpoint)
        if call.name == logic.COMPLETE_STEP and result.ok:
            self._emit_step()
            self._show()
        return call, result

    async def _dispatch(self, call: ToolCall, iteration: int, index: int
                        ) -> tuple[ToolCall, ToolResult]:
        """The call as it ran (a person may have edited its arguments when approving it)
        and its result: the plan's own step marker, a refusal (constraints, approval), an
        MCP tool, or a built-in tool's activity."""
        if call.name == logic.COMPLETE_STEP:
            return call, self._complete_step(call)
        if (refused := self._check_constraints(call, iteration)) is not None:
            return call, refused
        approved = await self._await_approval(call, f"{iteration}.{index}")
        if isinstance(approved, ToolResult):  # rejected
            return call, approved
        return approved, with_edit_note(await self._run_approved(approved, iteration, index),
                                        call, approved)

    async def _run_approved(self, call: ToolCall, iteration: int, index: int) -> ToolResult:
        if call.name in self.state.mcp.tools:
            return await self._call_mcp(call, self._call_id(iteration, index), self.keywords)
        if call.name not in self._builtin_tools():
            return ToolResult(
                ok=False,
                error=f"unknown tool '{call.name}'; available: "
                + ", ".join(spec.name for spec in self.tools),
            )
        return await self._run_builtin(call, iteration, index)

    def _complete_step(self, call: ToolCall) -> ToolResult:
        planning = self.state.planning
        result, done = logic.complete_step(planning.plan, planning.completed_steps,
                                           call.arguments)
        if result.ok:
            planning.completed_steps = done
        return result

    def _call_id(self, iteration: int, index: int) -> str:
        """Deterministic per call: the tools' idempotency key (the edit journal's)."""
        info = workflow.info()
        return f"{info.workflow_id}.{info.run_id[:8]}.{iteration}.{index}"

    async def _run_builtin(self, call: ToolCall, iteration: int, index: int) -> ToolResult:
        inp = self.state.input
        if call.name in self.edit_tools:
            self._journaled_calls().append(self._call_id(iteration, index))
        properties = self._builtin_tools()[call.name]
        try:
            return await self.activities.call(
                activity_calls.run_tool(call.name),
                RunToolInput(
                    call_id=self._call_id(iteration, index),
                    name=call.name,
                    arguments={k: v for k, v in call.arguments.items()
                               if k != "justification"},
                    workspace=inp.workspace,
                    allow_network=inp.allow_network,
                    allow_shell_operators=inp.allow_shell_operators,
                    # only a tool whose long output is windowed around them reads them
                    keywords=self.keywords if properties.windowed else [],
                    # the checkpoint after the call, taken in the same activity
                    checkpoint=self._checkpoint_request(call),
                ),
                summary=logic.tool_call_summary(call),  # the tool and its target
                # The run's own tool: its timeouts and attempts as they were at its start
                options=properties.activity.as_options(),
            )
        except ActivityError as err:  # one attempt only: say why it is not run again
            if properties.retry_safe:
                raise
            why = not_run_again(call.name, describe_failure(err))
            # The model reads it and decides (check the workspace, run it again or not):
            # one lost worker must not end a task of hours.
            return ToolResult(ok=False, error=f"E_INTERRUPTED: {why}")

    def _record_call(self, call: ToolCall, result: ToolResult, iteration: int,
                     checkpoint: dict[str, str] | None = None) -> None:
        """The call's outcome in the ledger, the counters and the events (with the
        workspace's checkpoint after it, if one was taken)."""
        calls = self.state.calls
        calls.ledger.append(completeness_logic.tool_record(
            call.name, call.arguments, result.ok, result.error, result.output, result.data))
        if result.ok and logic.is_edit(call.name, call.arguments, self.edit_tools,
                                       self._builtin_properties):
            calls.edits_ok += 1
        if result.ok and calls.changes is not None \
                and logic.may_change_workspace(call.name, call.arguments,
                                               self._builtin_properties):
            calls.changes[call.name] = calls.changes.get(call.name, 0) + 1
        stats = self.state.stats
        self.state.stats = stats.model_copy(update={
            "tool_calls": stats.tool_calls + 1,
            "tool_errors": stats.tool_errors + (0 if result.ok else 1),
        })
        self._emit("tool_result", {
            "iteration": iteration,
            "id": call.id,
            "tool": call.name,
            "ok": result.ok,
            "error": result.error,
            "output": logic.truncate(result.output, 500),
            "data": result.data,
            **(checkpoint or {}),
        })

    async def _summarize(self) -> None:
        transcript = logic.summary_transcript(self.state.events, self.state.reflection.supplements,
                                              self.state.conversation.answer)
        try:
            result = await self.activities.call(
                activity_calls.SUMMARIZE,
                SummarizeInput(
                    task=self.state.input.task,
                    transcript=transcript,
                    model=self.state.input.model,
                    endpoint=self.state.input.endpoint,
                ),
                summary="summary",
            )
        except ActivityError as err:
            self._account_failure(err)
            # The task is done; a missing summary must not turn it into a failure.
            self._emit("summary", {"summary": None, "error": describe_failure(err)})
            return
        self._account(result.usage)
        self.state.conversation.summary = result.summary
        self._emit("summary", {"summary": result.summary})

    # ------------------------------------------------------------ endings

    def _result(self, status: Literal["completed", "incomplete", "failed"], stop_reason: str,
                answer: str, missing: list[str] | None = None) -> TaskResult:
        info, constraints = workflow.info(), self.state.planning.constraints
        return TaskResult(
            task_id=self.state.task_id,
            workflow_id=info.workflow_id,
            status=status,
            stop_reason=stop_reason,
            answer=answer,
            missing=missing or [],
            summary=self.state.conversation.summary,
            intent=self.state.planning.intent,
            plan=self.state.planning.plan,
            completed_steps=self.state.planning.completed_steps,
            # A long run's result carries its recent events, as a continued run does
            events=self._carried_events(),
            stats=self.state.stats,
            quality_reviews=self.state.all_reviews,
            supplements=self.state.reflection.supplements,
            tool_violations=self.state.calls.violations,
            tool_violations_left_out=max(
                0, self.state.calls.violation_count - len(self.state.calls.violations)),
            allowed_tools_snapshot=constraints.allowed if constraints else [],
            edits_ok=self.state.all_edits_ok,
        )

    async def _finish_completed(self) -> TaskResult:
        planning = self.state.planning
        edits_ok = self.state.all_edits_ok
        unplanned_edit = logic.edit_task_without_plan(
            planning.intent, planning.plan, planning.direct_answer, self.state.input.task,
            read_unknown_intent=True)
        if unplanned_edit:  # a command may have made the change (`echo hi > hello.txt`)
            edits_ok += self._workspace_changes()
        missing = logic.missing_work(
            planning.plan, self.edit_tools, edits_ok, self._last_verdict(), unplanned_edit)
        if missing:
            return await self._finish_incomplete(missing)
        self._stop_indexing()
        await self._settle_indexing()
        self.state.status = "completed"
        self._emit("completed", {"answer": logic.truncate(self.state.conversation.answer, 2000)})
        result = self._result("completed", "final_answer", self.state.conversation.answer)
        self._show(result.status)
        await self._record("completed", result=result.model_dump(mode="json"))
        return result

    def _carried_events(self) -> list[Event]:
        """The events a result or the next run carries: the recent ones (the rest stayed in
        the live view and in the histories)."""
        return logic.recent_events(self.state.events, CARRIED_EVENTS,
                                   logic.CARRIED_EVENT_BYTES)

    def _workspace_changes(self) -> int:
        """Successful calls of this task that may have changed the workspace, counted in
        its state."""
        return sum((self.state.calls.changes or {}).values())

    def _last_verdict(self) -> dict[str, Any] | None:
        return self.state.reflection.last_verdict

    async def _finish_incomplete(self, missing: list[str],
                                 stop_reason: str = "work_missing") -> TaskResult:
        """Ran to the end, but the work is not done: never reported as completed."""
        self._stop_indexing()
        await self._settle_indexing()
        self.state.status = "incomplete"
        self._emit("incomplete", {"missing": missing,
                                  "answer": logic.truncate(self.state.conversation.answer, 2000)})
        result = self._result("incomplete", stop_reason, self.state.conversation.answer, missing)
        self._show(result.status)
        await self._record("incomplete", result=result.model_dump(mode="json"),
                           error="incomplete: " + "; ".join(missing)[:1000])
        return result

    async def _finish_failed(self, stop_reason: str, message: str) -> TaskResult:
        self._stop_indexing()
        await self._settle_indexing()
        self.state.status = "failed"
        self._emit("failed", {"stop_reason": stop_reason, "error": message})
        result = self._result("failed", stop_reason, message)
        self._show(result.status)
        await self._record("failed", result=result.model_dump(mode="json"), error=message)
        # Failing the run makes the Web UI show it; the details carry the full result.
        raise ApplicationError(
            message, result.model_dump(mode="json"), type=stop_reason, non_retryable=True
        )

    # ------------------------------------------------------------ helpers

    def _act_summary(self, iteration: int) -> str:
        plan = self.state.planning.plan
        return visibility.model_call_summary(
            "act", iteration, logic.current_step(plan, self.state.planning.completed_steps),
            len(plan.steps) if plan else 0)

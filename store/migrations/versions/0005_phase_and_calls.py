"""Add sessions.phase (what a running session is doing now) and steps.target_calls (target forwards per row).

A spectune step is one target call; a llama.cpp row is one request, covering many target calls, so mean
acceptance length (tokens per target call) is Σ emitted ÷ Σ target_calls for both.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("phase", sa.JSON(), nullable=True))
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("target_calls", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("target_calls")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("phase")

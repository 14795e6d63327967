//! `meridian cluster …`: status, leader transfers, replica moves, placement, decommission.

use super::ConnectArgs;
use crate::display::ClusterView;
use anyhow::Context;
use meridian_client::survival_plan::Move;
use meridian_client::Client;

/// `meridian cluster`: inspect the cluster, move a shard's leadership or replicas, change its
/// placement.
#[derive(Clone, Debug, clap::Args)]
pub struct ClusterCommand {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub op: ClusterOp,
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum ClusterOp {
    /// Nodes (labels, addresses, liveness) and shards (ranges, leaders, terms, indexes, lag).
    Status,
    /// Hand SHARD's leadership to NODE (a voter of the shard whose log has caught up) and wait
    /// until it leads. A shard with a home region moves back home unless NODE is in it.
    TransferLeader {
        /// The shard's id (`meridian cluster status` lists them).
        shard: u64,
        /// The node that should lead it.
        node: u64,
    },
    /// Add a replica of SHARD on NODE (a member without one): the stored shard map lists it,
    /// NODE catches up as a learner (log or snapshot), then it votes. Waits for all of it
    /// (raise --timeout-ms for a large shard); if cut short, run it again to finish the move.
    AddReplica {
        /// The shard's id (`meridian cluster status` lists them).
        shard: u64,
        /// The node that should hold the new replica.
        node: u64,
    },
    /// Remove NODE's replica of SHARD: it leaves the shard's Raft group, then the stored map;
    /// then NODE deletes the replica's data. The last voter cannot be removed.
    RemoveReplica {
        /// The shard's id.
        shard: u64,
        /// The node whose replica goes.
        node: u64,
    },
    /// Move every replica off NODE (an add-replica elsewhere, then a remove-replica, per
    /// shard; only the remove for a shard with enough replicas without NODE's), preferring
    /// targets in NODE's region, then regions the shard lacks, then the least loaded; then
    /// report NODE safe to stop. Run it again to finish an interrupted one.
    Decommission {
        /// The node to empty.
        node: u64,
    },
    /// Forget NODE, a member that holds no replica any more (after decommission): the
    /// members stop pinging it, counting it in the clock fence and listing it in status, and
    /// refuse its messages. Its id is never reused.
    Forget {
        /// The former member.
        node: u64,
    },
    /// Change SHARD's placement at run time: --home REGION makes REGION the shard's home (its
    /// leader moves to a caught-up replica there within a few election timeouts and returns
    /// after failovers), --home none drops it. REGION must hold a replica of SHARD. --survive
    /// zone keeps the votes in the home region (3 of the shard's replicas must be there: the
    /// command first adds the missing ones on live nodes of the region, new zones first; the
    /// others become learners: writes commit inside the region, follower reads still work
    /// elsewhere, losing the home region stops the shard); --survive region makes every
    /// replica vote again, then removes replicas while one region holds half of them or more
    /// (never the leader, never below three). --constraints "+region=eu-west,-zone=c" says
    /// which nodes may hold the shard's replicas (+ required, - prohibited; attributes region
    /// and zone; none clears them): stored first, then each replica that breaks them is
    /// replaced by one on an allowed live node (same region first), and every later move must
    /// obey them. Stored in the shard map: it overrides --home-regions and
    /// --replica-constraints from then on, restarts included.
    Placement {
        /// The data shard's id (`meridian cluster status` lists them).
        shard: u64,
        /// A region holding a replica of the shard, or `none`.
        #[arg(long, value_name = "REGION|none")]
        home: String,
        /// The failure the shard's voters survive: `region` (every replica votes) or `zone`
        /// (only the home region's). Unchanged when not given.
        #[arg(long, value_name = "region|zone")]
        survive: Option<meridian_client::Survival>,
        /// Replica constraints, comma-separated `+attribute=value` / `-attribute=value`
        /// (attributes: region, zone), or `none`. Unchanged when not given.
        #[arg(long, value_name = "CONSTRAINTS|none", allow_hyphen_values = true, value_parser = meridian_client::Constraints::parse)]
        constraints: Option<meridian_client::Constraints>,
    },
}

impl ClusterCommand {
    pub async fn run(&self) -> anyhow::Result<()> {
        match self.op {
            ClusterOp::Status => {
                let client = self.connect.connect().await?;
                print!("{}", gather_cluster_view(&client).await?.render());
            }
            ClusterOp::TransferLeader { shard, node } => {
                let client = self.connect.connect().await?;
                let (leader, term) = client
                    .transfer_leader(shard, node)
                    .await
                    .with_context(|| format!("transferring shard {shard} to node {node}"))?;
                println!("shard {shard}: node {leader} leads (term {term})");
            }
            ClusterOp::AddReplica { shard, node } => {
                let client = self.connect.connect().await?;
                let done = client
                    .add_replica(shard, node)
                    .await
                    .with_context(|| format!("adding a replica of shard {shard} on node {node}"))?;
                println!("shard {shard}: {}", render_change(&done));
            }
            ClusterOp::RemoveReplica { shard, node } => {
                let client = self.connect.connect().await?;
                let done = client
                    .remove_replica(shard, node)
                    .await
                    .with_context(|| format!("removing node {node}'s replica of shard {shard}"))?;
                println!("shard {shard}: {}", render_change(&done));
            }
            ClusterOp::Decommission { node } => {
                let client = self.connect.connect().await?;
                let moves = client
                    .decommission(node, |step| match step.to {
                        Some(to) => println!(
                            "shard {}: moved node {node}'s replica to node {to}: {}",
                            step.shard,
                            render_change(&step.change)
                        ),
                        None => println!(
                            "shard {}: removed node {node}'s replica (enough without it): {}",
                            step.shard,
                            render_change(&step.change)
                        ),
                    })
                    .await
                    .with_context(|| format!("decommissioning node {node}"))?;
                println!(
                    "node {node} holds no replicas ({} moved): safe to stop",
                    moves.len()
                );
            }
            ClusterOp::Forget { node } => {
                let client = self.connect.connect().await?;
                let version = client
                    .forget_member(node)
                    .await
                    .with_context(|| format!("forgetting node {node}"))?;
                println!("node {node} forgotten (shard map version {version})");
            }
            ClusterOp::Placement {
                shard,
                ref home,
                survive,
                ref constraints,
            } => {
                let region = Some(home.as_str()).filter(|h| *h != "none");
                let client = self.connect.connect().await?;
                let placed = client
                    .place(
                        shard,
                        region,
                        survive,
                        constraints.as_ref(),
                        |step, node, change| match step {
                            Move::Obeying { instead } => println!(
                                "shard {shard}: added a replica on node {node} in place of node \
                             {instead}'s, which breaks the constraints: {}",
                                render_change(change)
                            ),
                            Move::Breaking => println!(
                                "shard {shard}: removed node {node}'s replica, which breaks the \
                             constraints: {}",
                                render_change(change)
                            ),
                            Move::Added => println!(
                            "shard {shard}: added a replica on node {node} for zone survival: {}",
                            render_change(change)
                        ),
                            Move::Removed => println!(
                            "shard {shard}: removed node {node}'s replica, not needed for region \
                             survival: {}",
                            render_change(change)
                        ),
                        },
                    )
                    .await
                    .with_context(|| format!("placing shard {shard} (home {home})"))?;
                let version = placed.map_version;
                if let Some(warning) = &placed.warning {
                    eprintln!("warning: {warning}");
                }
                match survive {
                    Some(goal) if placed.warning.is_none() => println!(
                        "shard {shard}: home {home}, survives a {} failure (shard map version {version})",
                        goal.as_str()
                    ),
                    Some(goal) => println!(
                        "shard {shard}: home {home}, survival goal {} stored, not achieved (see \
                         the warning; shard map version {version})",
                        goal.as_str()
                    ),
                    None => println!("shard {shard}: home {home} (shard map version {version})"),
                }
                if let Some(constraints) = constraints {
                    println!("shard {shard}: replica constraints {constraints}");
                }
            }
        }
        Ok(())
    }
}

/// `voters [1, 2, 4] learners [] (shard map version 3)`.
fn render_change(done: &meridian_client::ReplicaChange) -> String {
    format!(
        "voters {:?} learners {:?} (shard map version {})",
        done.voters, done.learners, done.map_version
    )
}

/// Asks any node for the node list, then every node for its own view, concurrently.
pub async fn gather_cluster_view(client: &Client) -> anyhow::Result<ClusterView> {
    let base = client.status().await.context("cluster status")?;
    let answers =
        futures::future::join_all(base.nodes.iter().map(|node| async move {
            (node.node_id, client.node_status(&node.client_addr).await)
        }))
        .await;
    let mut view = ClusterView {
        base,
        ..Default::default()
    };
    for (node_id, answer) in answers {
        if let Ok(answer) = answer {
            view.answers.insert(node_id, answer);
        }
    }
    Ok(view)
}

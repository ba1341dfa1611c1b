// Nodes 2.0 folds a node's advanced inputs behind its "show advanced" button, but sizes every node from the
// classic canvas's least size, which counts every widget row: a folded node keeps the room of the rows it
// hides. For this pack's nodes with advanced inputs, while Nodes 2.0 is on and the node's advanced inputs are
// folded, the least size leaves those rows out, so the node is as tall as what it shows (the page element
// grows to its content either way). The classic canvas, which draws every widget, is unchanged: a node sized
// folded is enlarged to every row the first time the classic canvas draws it (Nodes 2.0 switched off).
import { app } from "../../scripts/app.js";

const pack = decodeURIComponent(new URL(import.meta.url).pathname.split("/")[2]); // /extensions/<pack folder>/
const ROW_GAP = 4; // the classic canvas's space after each widget row

function setting(id) {
    try {
        return app.extensionManager?.setting?.get?.(id) ?? app.ui?.settings?.getSettingValue?.(id);
    } catch {
        return undefined;
    }
}

function hasAdvanced(nodeData) {
    const inputs = { ...nodeData.input?.required, ...nodeData.input?.optional };
    return Object.values(inputs).some((spec) => Array.isArray(spec) && spec[1]?.advanced);
}

function folds(node) {
    return (
        Boolean(setting("Comfy.VueNodes.Enabled")) &&
        !node.showAdvanced &&
        !setting("Comfy.Node.AlwaysShowAdvancedWidgets")
    );
}

// Whether the classic least size counted this widget's row (each frontend version names the test its own way).
function counted(node, widget) {
    if (typeof node.isWidgetRowVisible === "function") return node.isWidgetRowVisible(widget);
    if (typeof node.isWidgetVisible === "function") return node.isWidgetVisible(widget);
    return !widget.hidden;
}

function rowHeight(node, widget, width) {
    if (widget.computeSize) return widget.computeSize(width)[1];
    if (widget.computeLayoutSize) return widget.computeLayoutSize(node).minHeight;
    return globalThis.LiteGraph?.NODE_WIDGET_HEIGHT ?? 20;
}

app.registerExtension({
    name: "comfyui-flux2-klein.folded-size",
    beforeRegisterNodeDef(nodeType, nodeData) {
        if (String(nodeData.python_module ?? "") !== `custom_nodes.${pack}` || !hasAdvanced(nodeData)) return;
        const computeSize = nodeType.prototype.computeSize;
        nodeType.prototype.computeSize = function (out) {
            const size = computeSize.call(this, out);
            if (!folds(this)) return size;
            this._flux2KleinSizedFolded = true;
            let folded = 0;
            for (const widget of this.widgets ?? []) {
                if (widget.options?.advanced && counted(this, widget)) {
                    folded += rowHeight(this, widget, size[0]) + ROW_GAP;
                }
            }
            size[1] = Math.max(size[1] - folded, 0);
            return size;
        };
        const onDrawForeground = nodeType.prototype.onDrawForeground;
        nodeType.prototype.onDrawForeground = function (...args) {
            if (this._flux2KleinSizedFolded && !folds(this)) {
                this._flux2KleinSizedFolded = false;
                const least = this.computeSize();
                if (this.size[1] < least[1]) this.setSize([Math.max(this.size[0], least[0]), least[1]]);
            }
            return onDrawForeground?.apply(this, args);
        };
    },
});
